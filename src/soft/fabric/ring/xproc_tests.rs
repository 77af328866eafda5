//! A ring across two processes: this test binary produces into a shared
//! segment and runs itself again, filtered to [`consumer_child`], to
//! consume it.

use super::tests::{check_tag, payload, Rng};
use super::*;
use crate::soft::fabric::shm::Segment;
use std::string::String;
use std::time::{Duration, Instant};
use std::vec;

/// The environment variable that names the segment for the child.
const ENV: &str = "RDD_RING_XPROC_SEGMENT";
/// Records sent.
const N: u64 = 100_000;
/// Data bytes of the ring.
const CAP: usize = 16384;
/// The whole exchange must end well before this.
const LIMIT: Duration = Duration::from_secs(20);

/// Unlinks the name when the test ends, passed or not.
struct Unlink<'a>(&'a str);
impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        Segment::unlink(self.0);
    }
}

/// The length of the body of record `seq` (both sides draw the same).
fn body_len(rng: &mut Rng) -> usize {
    rng.below(500) as usize
}

#[test]
fn producer_and_consumer_in_two_processes() {
    let name = std::format!("rdd-test-xproc-{}", std::process::id());
    Segment::unlink(&name);
    let _u = Unlink(&name);
    let seg = Segment::create(&name, ring_bytes(CAP)).unwrap();
    // SAFETY: the segment is ring_bytes(CAP) bytes, page-aligned, and lives
    // until the end of the test; this is the only producer.
    let mut tx = unsafe { RingTx::init(seg.as_ptr(), CAP) }.unwrap();
    let test = std::format!(
        "{}::consumer_child",
        module_path!().split_once("::").map_or("", |p| p.1)
    );
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, &name)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut rng = Rng(7);
    for seq in 0..N {
        let body = payload(seq, body_len(&mut rng));
        let tag = check_tag(&[&seq.to_le_bytes()[..], &body].concat());
        while !tx.push(tag, &[&seq.to_le_bytes(), &body]) {
            assert!(start.elapsed() < LIMIT, "consumer stalled at {seq}");
            if let Some(st) = child.try_wait().unwrap() {
                panic!("consumer exited early: {st}");
            }
            std::thread::yield_now();
        }
    }
    tx.close();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {text}");
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
    assert!(text.contains("xproc consumer: 100000 records"), "{text}");
}

/// The consumer side; passes trivially unless started by the test above.
#[test]
fn consumer_child() {
    let Ok(name) = std::env::var(ENV) else {
        return;
    };
    let seg = Segment::open(&name, ring_bytes(CAP)).unwrap().unwrap();
    // SAFETY: the mapping lives until the end of this function.
    let mut rx = unsafe { RingRx::attach(seg.as_ptr(), seg.len()) }.unwrap();
    let data = seg.as_ptr() as usize + RING_HEADER;
    let start = Instant::now();
    let mut rng = Rng(7);
    let mut v = vec![0u8; CAP];
    let mut seq = 0u64;
    loop {
        match rx.peek().unwrap() {
            Some(r) => {
                let p = r.ptr as usize;
                assert!(p >= data && p + r.len <= data + CAP);
                let n = rx.copy_payload(&r, &mut v);
                assert_eq!(n, 8 + body_len(&mut rng), "length of {seq}");
                assert_eq!(check_tag(&v[..n]), r.tag, "checksum of {seq}");
                assert_eq!(v[..8], seq.to_le_bytes(), "order");
                assert_eq!(v[8..n], payload(seq, n - 8)[..], "body of {seq}");
                rx.pop();
                seq += 1;
            }
            None if rx.is_closed() => break,
            None => {
                assert!(start.elapsed() < LIMIT, "producer stalled at {seq}");
                std::thread::yield_now();
            }
        }
    }
    assert_eq!(seq, N);
    std::println!("xproc consumer: {seq} records");
}
