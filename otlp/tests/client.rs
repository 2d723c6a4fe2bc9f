//! The HTTP client's rules: `Retry-After`, the `User-Agent`.

use std::time::{Duration, SystemTime};

use edgemark_otlp::client::{MAX_RETRY_AFTER, USER_AGENT_VALUE, retry_after};

#[test]
fn retry_after_takes_seconds_and_http_dates_with_a_cap() {
    assert_eq!(retry_after("2"), Some(Duration::from_secs(2)));
    assert_eq!(retry_after(" 3 "), Some(Duration::from_secs(3)));
    assert_eq!(retry_after("86400"), Some(MAX_RETRY_AFTER));
    // A date in the past: no wait.
    assert_eq!(
        retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(Duration::ZERO)
    );
    // A date 50 seconds ahead, formatted as RFC 9110's IMF-fixdate (whole
    // seconds: up to one lost), read back however long this thread waits
    // in between, up to 40 s.
    let ahead = SystemTime::now() + Duration::from_secs(50);
    let secs = ahead
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let wait = retry_after(&imf_fixdate(secs)).unwrap();
    assert!(
        wait <= Duration::from_secs(50) && wait >= Duration::from_secs(9),
        "{wait:?}"
    );
    assert_eq!(retry_after("soon"), None);
    assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 PST"), None);
}

#[test]
fn the_user_agent_names_edgemark_and_its_version() {
    assert_eq!(
        USER_AGENT_VALUE,
        format!("edgemark/{}", env!("CARGO_PKG_VERSION"))
    );
}

/// `secs` since the epoch as an IMF-fixdate.
fn imf_fixdate(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekdays = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
        weekdays[(days.rem_euclid(7)) as usize],
        months[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
