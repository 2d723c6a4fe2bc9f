//! The upstream recorder's cases, in one process (see `tests/common`).

mod common;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            common::$name(&mut common::InProcess::new());
        }
    )*};
}

cases!(
    case_01_two_stage_flow_each_event_once,
    case_02_failed_send,
    case_02_failed_admission,
    case_03_empty_terminal_payload,
    case_04_consumer_buffering,
    case_05_isolation_and_fencing,
    case_06_cross_clock_deltas_and_detached_snapshots,
    case_07_zero_versus_missing_and_order,
    case_08_close_fences_late_events_and_id_reuse,
    case_09_every_cleanup_path_releases,
    case_10_incremental_detached_response_snapshots,
    case_11_invalid_elapsed_times,
);
