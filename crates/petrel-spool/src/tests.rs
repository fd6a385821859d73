use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use super::*;

fn opts(segment_bytes: u64, max_bytes: u64) -> WriterOptions {
    WriterOptions {
        segment_bytes,
        max_bytes,
        allow_oversized: false,
    }
}

/// Reads everything available, completing each chunk when `commit`.
fn drain(r: &mut Reader, commit: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(c) = r.read(4096).unwrap() {
        for rec in &c.records {
            out.push(c.buf[rec.clone()].to_vec());
        }
        if commit {
            r.complete(c.segment, c.start, c.end);
        }
    }
    out
}

fn numbered(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("record {i} {}", "x".repeat(i % 50)).into_bytes())
        .collect()
}

#[test]
fn records_round_trip_across_segments_and_finished_segments_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(2000);
    {
        let mut w = Writer::open(dir.path(), opts(8 << 10, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
        w.sync().unwrap();
    }
    let segments = list_segments(dir.path()).unwrap().len();
    assert!(segments > 3, "expected several segments, got {segments}");
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), recs);
    r.maintain(true).unwrap();
    assert_eq!(list_segments(dir.path()).unwrap().len(), 0);
    assert_eq!(r.corrupt_bytes(), 0);
}

#[test]
fn a_reopened_reader_resumes_after_the_committed_prefix_only() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(300);
    {
        let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
    }
    let mut r = Reader::open(dir.path()).unwrap();
    let a = r.read(1000).unwrap().unwrap();
    let b = r.read(1000).unwrap().unwrap();
    let c = r.read(1000).unwrap().unwrap();
    // Delivered out of order: a and c. Only a counts as committed.
    r.complete(a.segment, a.start, a.end);
    r.complete(c.segment, c.start, c.end);
    r.maintain(true).unwrap();
    drop(r);
    let mut r = Reader::open(dir.path()).unwrap();
    let again = drain(&mut r, true);
    assert_eq!(again, recs[a.records.len()..].to_vec());
    assert!(b.records.len() + c.records.len() <= again.len());
}

#[test]
fn a_second_reader_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _r = Reader::open(dir.path()).unwrap();
    let e = Reader::open(dir.path()).err().unwrap();
    assert!(e.to_string().contains("already read"), "{e}");
}

#[test]
fn a_torn_tail_of_a_dead_writer_keeps_the_good_prefix_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(100);
    {
        let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
    }
    let (seq, len) = list_segments(dir.path()).unwrap()[0];
    let path = dir.path().join(segment_name(seq));
    // A crash mid-write: a header promising 100 bytes, 10 of them there.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&100u32.to_le_bytes()).unwrap();
    f.write_all(&[0; 4]).unwrap();
    f.write_all(&[b'y'; 10]).unwrap();
    drop(f);
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), recs);
    assert_eq!(r.corrupt_bytes(), 18);
    r.maintain(true).unwrap();
    assert!(
        !path.exists(),
        "finished segment of {len} bytes not deleted"
    );
}

/// Writes `recs` into one finished segment and returns its path and the
/// offset of record `i`'s header.
fn one_segment(dir: &std::path::Path, recs: &[Vec<u8>], i: usize) -> (std::path::PathBuf, usize) {
    {
        let mut w = Writer::open(dir, opts(1 << 30, 1 << 30)).unwrap();
        for r in recs {
            w.append(r).unwrap();
        }
    }
    let segs = list_segments(dir).unwrap();
    assert_eq!(segs.len(), 1);
    let off = recs[..i].iter().map(|r| RECORD_HEADER + r.len()).sum();
    (dir.join(segment_name(segs[0].0)), off)
}

#[test]
fn a_damaged_record_is_skipped_and_reading_goes_on_at_the_next_valid_one() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(20_000);
    let (path, off) = one_segment(dir.path(), &recs, 9_000);
    let mut bytes = std::fs::read(&path).unwrap();
    // Flip one payload byte of record 9000.
    bytes[off + RECORD_HEADER + 3] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let mut want = recs.clone();
    want.remove(9_000);
    assert_eq!(drain(&mut r, true), want);
    assert_eq!(
        r.corrupt_bytes(),
        (RECORD_HEADER + recs[9_000].len()) as u64
    );
    assert_eq!(r.damaged_records(), 1);
    r.maintain(true).unwrap();
    // Not deleted: kept for an operator to look at.
    assert!(!path.exists());
    let q = dir.path().join(QUARANTINE_DIR);
    assert_eq!(list_segments(&q).unwrap().len(), 1);
    assert_eq!(list_segments(dir.path()).unwrap().len(), 0);
    assert_eq!(r.quarantined_segments(), 1);
}

#[test]
fn a_bad_length_in_the_first_record_loses_only_that_record() {
    for bad_len in [u32::MAX, 1_000_000, 3] {
        let dir = tempfile::tempdir().unwrap();
        let recs = numbered(20_000);
        let (path, _) = one_segment(dir.path(), &recs, 0);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..4].copy_from_slice(&bad_len.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let mut r = Reader::open(dir.path()).unwrap();
        assert_eq!(drain(&mut r, true), recs[1..].to_vec(), "length {bad_len}");
        assert_eq!(r.damaged_records(), 1);
        r.maintain(true).unwrap();
        assert_eq!(
            list_segments(&dir.path().join(QUARANTINE_DIR))
                .unwrap()
                .len(),
            1
        );
    }
}

#[test]
fn a_reader_restarted_after_a_damaged_record_resumes_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(3_000);
    let (path, off) = one_segment(dir.path(), &recs, 10);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[off + RECORD_HEADER] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    {
        let mut r = Reader::open(dir.path()).unwrap();
        // Read without committing the first chunks: then commit all.
        let mut chunks = Vec::new();
        while let Some(c) = r.read(4096).unwrap() {
            chunks.push((c.segment, c.start, c.end, c.records.len()));
            if chunks.len() == 3 {
                break;
            }
        }
        for (s, a, b, _) in &chunks {
            r.complete(*s, *a, *b);
        }
        r.maintain(true).unwrap();
    }
    let mut r = Reader::open(dir.path()).unwrap();
    let rest = drain(&mut r, true);
    let mut want = recs.clone();
    want.remove(10);
    assert_eq!(rest, want[want.len() - rest.len()..].to_vec());
    assert!(rest.len() < want.len());
}

#[test]
fn a_torn_tail_is_not_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(100);
    let (path, _) = one_segment(dir.path(), &recs, 0);
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&500u32.to_le_bytes()).unwrap();
    f.write_all(b"half").unwrap();
    drop(f);
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), recs);
    assert_eq!(r.corrupt_bytes(), 8);
    r.maintain(true).unwrap();
    assert!(!path.exists());
    assert!(!dir.path().join(QUARANTINE_DIR).exists());
}

#[test]
fn an_incomplete_record_of_a_live_writer_is_waited_for_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
    w.append(b"one").unwrap();
    w.flush().unwrap();
    let (seq, _) = list_segments(dir.path()).unwrap()[0];
    let path = dir.path().join(segment_name(seq));
    // Half of the next record reaches the file while its writer lives.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&5u32.to_le_bytes()).unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), vec![b"one".to_vec()]);
    assert_eq!(r.read(4096).unwrap().map(|c| c.records.len()), None);
    assert_eq!(r.corrupt_bytes(), 0);
    drop(w);
    // The writer's own flush came after the stray bytes; once it is gone
    // the tail is judged: the stray header makes the rest unreadable.
    let _ = drain(&mut r, true);
    assert!(r.corrupt_bytes() > 0);
}

#[test]
fn a_full_spool_refuses_appends_until_the_reader_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), opts(4 << 10, 16 << 10)).unwrap();
    let rec = vec![b'z'; 1000];
    let mut accepted = 0;
    loop {
        match w.append(&rec) {
            Ok(()) => accepted += 1,
            Err(AppendError::Full) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(accepted < 100, "never full");
    }
    w.flush().unwrap();
    assert!(spool_bytes(dir.path()).unwrap() <= 16 << 10);
    assert_eq!(accepted, 16 * 1024 / 1008);
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true).len(), accepted);
    r.maintain(true).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // Everything was delivered; the writer measures again and has room.
    w.append(&rec).unwrap();
}

/// The wedge of issue 19: a cap below the segment size, a healthy reader
/// that commits everything, and a long-running writer. The delivered part
/// of the open segment must not count against the cap, and the segment
/// must be let go of so that the disk is freed.
#[test]
fn a_cap_below_the_segment_size_never_wedges_with_a_healthy_reader() {
    let dir = tempfile::tempdir().unwrap();
    // The old default: 32 MiB segments, whatever the cap.
    let mut w = Writer::open(dir.path(), opts(32 << 20, 64 << 10)).unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let rec = vec![b'q'; 500];
    let mut delivered = 0usize;
    for i in 0..5_000 {
        let mut tries = 0;
        loop {
            match w.append(&rec) {
                Ok(()) => break,
                Err(AppendError::Full) => {
                    w.flush().unwrap();
                    delivered += drain(&mut r, true).len();
                    r.maintain(true).unwrap();
                    std::thread::sleep(Duration::from_millis(11));
                    tries += 1;
                    assert!(
                        tries < 50,
                        "record {i}: the spool stays full although everything was delivered"
                    );
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    w.flush().unwrap();
    // New segments are listed at most every 50 ms.
    std::thread::sleep(Duration::from_millis(60));
    delivered += drain(&mut r, true).len();
    assert_eq!(delivered, 5_000);
    r.maintain(true).unwrap();
    // The disk holds at most the cap plus one segment's delivered part.
    assert!(spool_bytes(dir.path()).unwrap() <= 2 * (64 << 10));
}

#[test]
fn segments_are_sized_from_the_cap() {
    assert_eq!(WriterOptions::for_cap(2 << 20).segment_bytes, 512 << 10);
    assert_eq!(
        WriterOptions::for_cap(1 << 30).segment_bytes,
        MAX_SEGMENT_BYTES
    );
    assert_eq!(WriterOptions::default().segment_bytes, MAX_SEGMENT_BYTES);
}

#[test]
fn a_record_larger_than_the_cap_is_too_large_not_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), opts(1 << 20, 4 << 10)).unwrap();
    assert!(matches!(w.append(&[0u8; 5000]), Err(AppendError::TooLarge)));
    w.append(&[0u8; 100]).unwrap();
}

#[test]
fn two_writers_share_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
    let mut b = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
    a.append(b"a1").unwrap();
    b.append(b"b1").unwrap();
    a.flush().unwrap();
    b.flush().unwrap();
    a.append(b"a2").unwrap();
    a.flush().unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let mut got = drain(&mut r, true);
    got.sort();
    assert_eq!(got, vec![b"a1".to_vec(), b"a2".to_vec(), b"b1".to_vec()]);
    // Both segments are still held: nothing deleted yet.
    r.maintain(true).unwrap();
    assert_eq!(list_segments(dir.path()).unwrap().len(), 2);
    drop(a);
    drop(b);
    assert!(drain(&mut r, true).is_empty());
    r.maintain(true).unwrap();
    assert_eq!(list_segments(dir.path()).unwrap().len(), 0);
}

#[test]
fn shared_writer_makes_waited_records_durable_and_tells_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
    let shared = std::sync::Arc::new(SharedWriter::new(w, Duration::from_secs(3600)).unwrap());
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s2 = seen.clone();
    shared.on_durable(move |d| s2.store(d, std::sync::atomic::Ordering::SeqCst));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let ticket = shared
                        .append_with(|b| b.extend_from_slice(format!("{t}-{i}").as_bytes()))
                        .unwrap();
                    // Despite an interval of an hour, a waiter is served.
                    assert!(shared.wait_durable(ticket, Duration::from_secs(10)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shared.durable(), 400);
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 400);
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, false).len(), 400);
}

#[test]
fn oversized_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), opts(1 << 20, u64::MAX)).unwrap();
    let big = vec![0u8; MAX_RECORD + 1];
    assert!(matches!(w.append(&big), Err(AppendError::TooLarge)));
    w.append(b"after").unwrap();
    w.flush().unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, false), vec![b"after".to_vec()]);
}

#[test]
fn a_record_larger_than_the_read_size_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![7u8; 100_000];
    {
        let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
        w.append(&big).unwrap();
        w.append(b"small").unwrap();
    }
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, false), vec![big, b"small".to_vec()]);
}

#[test]
fn a_committed_offset_past_the_end_is_reported_and_the_segment_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(200);
    {
        let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
    }
    let (seq, len) = list_segments(dir.path()).unwrap()[0];
    // A damaged state file (or a segment whose tail a system crash lost
    // after delivery): the position names more than the file holds.
    // Skipping the segment would lose it silently; reading it again can
    // only duplicate.
    std::fs::write(
        dir.path().join("reader.state"),
        format!("{seq:016x} {}\n", len + 100),
    )
    .unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let damage = r.take_damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(
        damage[0].what.contains("past the segment's end"),
        "{damage:?}"
    );
    assert_eq!(drain(&mut r, true), recs);
    r.maintain(true).unwrap();
    assert!(list_segments(dir.path()).unwrap().is_empty());
    // Reported once: the replaced position was written back.
    drop(r);
    let mut r = Reader::open(dir.path()).unwrap();
    assert!(r.take_damage().is_empty());
}

#[test]
fn a_garbage_state_file_is_reported_and_every_segment_read_from_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(500);
    {
        let mut w = Writer::open(dir.path(), opts(4 << 10, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
    }
    let mut junk = vec![0xffu8, 0xfe, b'\n', b'x'];
    junk.extend((0..3000u32).map(|i| (i * 7919 % 251) as u8));
    std::fs::write(dir.path().join("reader.state"), &junk).unwrap();
    // Neither the writer nor the reader refuses the directory.
    let w = Writer::open(dir.path(), opts(4 << 10, 1 << 30)).unwrap();
    drop(w);
    let mut r = Reader::open(dir.path()).unwrap();
    let damage = r.take_damage();
    assert!(!damage.is_empty());
    assert!(damage[0].what.contains("unreadable line"), "{damage:?}");
    assert_eq!(drain(&mut r, true), recs);
}

#[test]
fn a_committed_offset_inside_a_record_is_replaced_by_the_segment_start() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(100);
    let (path, off) = one_segment(dir.path(), &recs, 40);
    let seq = list_segments(dir.path()).unwrap()[0].0;
    std::fs::write(
        dir.path().join("reader.state"),
        format!("{seq:016x} {}\n", off + 3),
    )
    .unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let damage = r.take_damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(damage[0].what.contains(&path.display().to_string()));
    assert_eq!(drain(&mut r, true), recs);
    // A good position is kept as it is.
    let dir = tempfile::tempdir().unwrap();
    let (_, off) = one_segment(dir.path(), &recs, 40);
    let seq = list_segments(dir.path()).unwrap()[0].0;
    std::fs::write(
        dir.path().join("reader.state"),
        format!("{seq:016x} {off}\n"),
    )
    .unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    assert!(r.take_damage().is_empty());
    assert_eq!(drain(&mut r, true), recs[40..].to_vec());
}

#[test]
fn zeros_in_a_segment_are_damage_never_empty_records() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(300);
    let (path, off) = one_segment(dir.path(), &recs, 100);
    // A hole of zeros where records 100.. were (what an old writer left
    // after a failed write), with the records after it intact.
    let mut bytes = std::fs::read(&path).unwrap();
    let hole = RECORD_HEADER * 6 + recs[100].len() + recs[101].len();
    for b in &mut bytes[off..off + hole] {
        *b = 0;
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut r = Reader::open(dir.path()).unwrap();
    let got = drain(&mut r, true);
    assert!(
        got.iter().all(|g| !g.is_empty()),
        "an empty record was read"
    );
    assert_eq!(got[..100], recs[..100]);
    assert!(got.len() >= 300 - 4, "read {} of 300", got.len());
    assert_eq!(got.last(), recs.last());
    let damage = r.take_damage();
    assert!(!damage.is_empty());
    assert_eq!(damage[0].offset, off as u64);
}

#[test]
fn a_delivered_record_is_committed_without_the_rest_of_its_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let recs = numbered(50);
    {
        let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
        for r in &recs {
            w.append(r).unwrap();
        }
    }
    let mut r = Reader::open(dir.path()).unwrap();
    let c = r.read(1 << 20).unwrap().unwrap();
    assert_eq!(c.records.len(), 50);
    // The first ten records answered, one at a time (out of order).
    let ends: Vec<(u64, u64)> = c
        .records
        .iter()
        .map(|p| {
            (
                c.start + (p.start - RECORD_HEADER) as u64,
                c.start + p.end as u64,
            )
        })
        .collect();
    for i in (0..10).rev() {
        r.complete(c.segment, ends[i].0, ends[i].1);
    }
    r.maintain(true).unwrap();
    drop(r);
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, false), recs[10..].to_vec());
}

#[test]
fn a_write_that_fails_part_way_leaves_no_hole_and_never_cuts_synced_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), opts(1 << 20, 1 << 30)).unwrap();
    let recs = numbered(3000);
    let mut synced = 0;
    let mut k = 0;
    // Appends with a sync after every 100; every third flush the disk is
    // "full" part way through, then has room again.
    for (i, r) in recs.iter().enumerate() {
        w.append(r).unwrap();
        if i % 100 == 99 {
            k += 1;
            if k % 3 == 0 {
                writer::fault::fail_writes_after(777);
                assert!(w.flush().is_err());
                assert!(w.write_error().is_some());
            }
            // The disk has room again: the records are written after the
            // last whole one, and made durable.
            w.sync().unwrap();
            synced = i + 1;
        }
    }
    assert_eq!(synced, 3000);
    w.crash();
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), recs);
    assert_eq!(r.corrupt_bytes(), 0);
    assert!(r.take_damage().is_empty());
}

#[test]
fn an_oversized_record_waits_for_an_empty_spool_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let o = WriterOptions {
        allow_oversized: true,
        ..opts(4 << 10, 16 << 10)
    };
    let mut w = Writer::open(dir.path(), o).unwrap();
    w.append(b"small").unwrap();
    w.sync().unwrap();
    let big = vec![b'b'; 40 << 10];
    // Not refused for good: full while something is undelivered...
    assert!(matches!(w.append(&big), Err(AppendError::Full)));
    let mut r = Reader::open(dir.path()).unwrap();
    assert_eq!(drain(&mut r, true), vec![b"small".to_vec()]);
    r.maintain(true).unwrap();
    // ...and written once the spool is empty.
    std::thread::sleep(Duration::from_millis(20));
    w.append(&big).unwrap();
    w.sync().unwrap();
    // The reader lists new segments at most every 50 ms.
    std::thread::sleep(Duration::from_millis(60));
    let got = drain(&mut r, true);
    assert!(got == vec![big], "read {} records", got.len());
}
