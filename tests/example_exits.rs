//! The examples' exit status convention (README, "Examples"): 0 success,
//! 1 a run that failed, 2 nothing ran (a bad command line, or a request
//! this build or device cannot serve). Runs the example binaries `cargo
//! test` builds next to this test (target/<profile>/examples) with bad
//! arguments; each must exit 2 and say what is wrong, without running.

use std::path::PathBuf;
use std::process::Command;

/// target/<profile>/examples/<name>: this test is target/<profile>/deps/..
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("current_exe");
    let dir = me
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .join("examples");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: `cargo test` builds the examples (with `--test example_exits` \
         alone, run `cargo build --examples` first)",
        p.display()
    );
    p
}

/// Runs `name args`; returns (status, stderr).
fn run(name: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(example(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_exit_2_in_every_example() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("pingpong", &["--bogus"], "unknown argument --bogus"),
        ("pingpong", &["--size", "x"], "--size: not a number"),
        (
            "pingpong",
            &["--server", "--connect", "h"],
            "exclude each other",
        ),
        ("pingpong", &["--port", "1"], "two-process mode"),
        ("pingpong", &["--ud", "--size", "4097"], "MTU"),
        ("pingpong", &["--ud", "--chk", "--server"], "RC option"),
        ("write_bw", &["--bogus"], "unknown argument"),
        ("write_bw", &["--iters"], "needs a value"),
        ("atomic_counter", &["--bogus"], "unknown argument"),
        ("atomic_counter", &["--threads", "x"], "not a number"),
        ("srq_server", &["--bogus"], "unknown argument"),
        (
            "srq_server",
            &["--active", "9", "--clients", "8"],
            "--active",
        ),
        ("credit_stream", &["--bogus"], ""),
        ("wqe_tour", &["--bogus"], "usage"),
        // Without the verbs backend rping cannot run at all (2); with it,
        // a bad flag (2).
        ("rping", &["--bogus"], ""),
    ];
    for (name, args, text) in cases {
        let (code, err) = run(name, args);
        assert_eq!(
            code,
            Some(2),
            "{name} {args:?}: exit status (stderr: {err})"
        );
        assert!(
            err.contains(text),
            "{name} {args:?}: stderr should say {text:?}: {err}"
        );
    }
}

/// `--device` needs the verbs backend: a build without it refuses the
/// flag before running anything.
#[cfg(not(feature = "verbs"))]
#[test]
fn device_flag_without_verbs_exits_2() {
    for name in ["pingpong", "write_bw", "atomic_counter", "srq_server"] {
        let (code, err) = run(name, &["--device", "rxe0"]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains("--features verbs"), "{name}: {err}");
    }
}
