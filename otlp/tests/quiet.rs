//! The library prints nothing and handles no signal: its notes go through
//! the `log` facade, and stopping on a signal is the program's to do
//! (`Stopper::stop`). Read from its sources, outside comments.

use std::path::Path;

#[test]
fn the_library_neither_prints_nor_handles_signals() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for banned in [
                "println!",
                "eprintln!",
                "print!",
                "eprint!",
                "std::io::stdout",
                "std::io::stderr",
                "tokio::signal",
                "std::process::exit",
            ] {
                assert!(
                    !code.contains(banned),
                    "{}:{}: {banned}: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
    }
    assert!(files > 5, "read {files} files of {}", src.display());
}
