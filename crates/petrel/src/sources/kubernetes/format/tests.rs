use super::*;

fn decoder(max: usize) -> ContainerDecoder {
    ContainerDecoder::new(
        max,
        Streams {
            stdout: true,
            stderr: true,
        },
        FormatCounters::default(),
    )
}

/// (message, stream) pairs of one decode call.
fn msgs(d: &Decoded) -> Vec<(String, Stream)> {
    d.msgs
        .iter()
        .map(|m| {
            (
                String::from_utf8_lossy(&d.out[m.start..m.start + m.len]).into_owned(),
                m.stream,
            )
        })
        .collect()
}

const T: &str = "2024-03-01T10:20:30.123456789Z";

#[test]
fn cri_full_records_keep_time_and_stream() {
    let raw = format!("{T} stdout F hello world\n{T} stderr F oops\n{T} stdout F \n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    assert_eq!(
        msgs(&d),
        vec![
            ("hello world".into(), Stream::Stdout),
            ("oops".into(), Stream::Stderr),
            ("".into(), Stream::Stdout)
        ]
    );
    assert_eq!(d.held, raw.len());
    assert_eq!(d.msgs[0].time_ns, Some(1_709_288_430_123_456_789));
}

#[test]
fn cri_partials_merge_across_calls_and_hold_the_chain() {
    let p1 = format!("{T} stdout P aaaa\n");
    let p2 = format!("{T} stdout P bbbb\n");
    let f = format!("{T} stdout F cccc\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    // The chain is unfinished: nothing out, everything held.
    let first = format!("{p1}{p2}");
    dec.decode(first.as_bytes(), 100, false, &mut d);
    assert!(d.msgs.is_empty());
    assert_eq!(d.held, 0);
    // The reader hands the held bytes again with the rest.
    let all = format!("{p1}{p2}{f}");
    dec.decode(all.as_bytes(), 100, false, &mut d);
    assert_eq!(msgs(&d), vec![("aaaabbbbcccc".into(), Stream::Stdout)]);
    assert_eq!(d.held, all.len());
}

#[test]
fn interleaved_streams_are_merged_per_stream_without_duplicates() {
    let a = format!("{T} stdout P out-1.\n");
    let b = format!("{T} stderr F err line\n");
    let c = format!("{T} stdout P out-2.\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    let first = format!("{a}{b}{c}");
    dec.decode(first.as_bytes(), 0, false, &mut d);
    // stderr's record is complete and goes out; stdout's chain is held
    // from its first record, which comes before it.
    assert_eq!(msgs(&d), vec![("err line".into(), Stream::Stderr)]);
    assert_eq!(d.held, 0);
    let e = format!("{T} stdout F end\n");
    let second = format!("{first}{e}");
    dec.decode(second.as_bytes(), 0, false, &mut d);
    assert_eq!(msgs(&d), vec![("out-1.out-2.end".into(), Stream::Stdout)]);
    assert_eq!(d.held, second.len());
}

#[test]
fn reset_forgets_emitted_records_so_a_reread_emits_them_again() {
    let a = format!("{T} stdout P x\n");
    let b = format!("{T} stderr F y\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    let raw = format!("{a}{b}");
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    assert_eq!(msgs(&d).len(), 1);
    dec.reset();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    assert_eq!(msgs(&d), vec![("y".into(), Stream::Stderr)]);
}

#[test]
fn a_chain_longer_than_the_limit_is_cut_and_counted() {
    let part = "x".repeat(600);
    let raw = format!("{T} stdout P {part}\n{T} stdout P {part}\n{T} stdout F {part}\n");
    let mut dec = decoder(1024);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    let got = msgs(&d);
    // 1200 bytes reach the limit: cut into 1024 + 176, then the last part.
    assert_eq!(
        got.iter().map(|(m, _)| m.len()).collect::<Vec<_>>(),
        vec![1024, 176, 600]
    );
    assert_eq!(dec.counters.cut.get(), 1);
    assert_eq!(d.held, raw.len());
}

#[test]
fn flush_emits_an_unfinished_chain_and_counts_it() {
    let raw = format!("{T} stdout P start of a line cut by rotation\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, true, &mut d);
    assert_eq!(
        msgs(&d),
        vec![("start of a line cut by rotation".into(), Stream::Stdout)]
    );
    assert_eq!(d.held, raw.len());
    assert_eq!(dec.counters.unfinished.get(), 1);
}

#[test]
fn invalid_records_pass_through_counted() {
    let raw = format!("garbage without format\n{T} stdout X bad tag\nnot-a-time stdout F x\n{{\"log\":1}}\n{T} stdout F ok\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    let got = msgs(&d);
    assert_eq!(got.len(), 5);
    assert_eq!(got[0], ("garbage without format".into(), Stream::None));
    assert_eq!(got[4], ("ok".into(), Stream::Stdout));
    assert_eq!(dec.counters.invalid.get(), 4);
}

#[test]
fn streams_not_wanted_are_skipped() {
    let raw = format!("{T} stdout F a\n{T} stderr F b\n");
    let mut dec = ContainerDecoder::new(
        1 << 20,
        Streams {
            stdout: false,
            stderr: true,
        },
        FormatCounters::default(),
    );
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    assert_eq!(msgs(&d), vec![("b".into(), Stream::Stderr)]);
    assert_eq!(d.held, raw.len());
}

#[test]
fn docker_records_unescape_and_merge_16k_partials() {
    let chunk = "y".repeat(16384);
    let mut raw = String::new();
    for _ in 0..3 {
        raw.push_str(&format!(
            "{{\"log\":\"{chunk}\",\"stream\":\"stdout\",\"time\":\"2024-03-01T10:20:30.5Z\"}}\n"
        ));
    }
    raw.push_str("{\"log\":\"tail\\n\",\"stream\":\"stdout\",\"time\":\"2024-03-01T10:20:31Z\"}\n");
    raw.push_str("{\"log\":\"tab\\there \\\"q\\\" \\u00e9\\ud83d\\ude00 \\\\ end\\n\",\"stream\":\"stderr\",\"time\":\"2024-03-01T10:20:32Z\"}\n");
    // Another field order, as other writers produce: the slow path.
    raw.push_str("{\"stream\":\"stdout\",\"log\":\"reordered\\n\",\"time\":\"2024-03-01T10:20:33Z\",\"attrs\":{\"a\":\"b\"}}\n");
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    let got = msgs(&d);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].0.len(), 3 * 16384 + 4);
    assert!(got[0].0.ends_with("ytail"));
    assert_eq!(d.msgs[0].time_ns, Some(1_709_288_430_500_000_000));
    assert_eq!(
        got[1],
        ("tab\there \"q\" é😀 \\ end".into(), Stream::Stderr)
    );
    assert_eq!(got[2], ("reordered".into(), Stream::Stdout));
    assert_eq!(d.held, raw.len());
}

#[test]
fn docker_partial_chain_is_held_until_its_end() {
    let p = "{\"log\":\"part-\",\"stream\":\"stdout\",\"time\":\"2024-03-01T10:20:30Z\"}\n";
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(p.as_bytes(), 0, false, &mut d);
    assert!(d.msgs.is_empty());
    assert_eq!(d.held, 0);
}

#[test]
fn cri_time_with_offset_is_read() {
    let raw = "2024-03-01T18:20:30.000000001+08:00 stdout F x\n";
    let mut dec = decoder(1 << 20);
    let mut d = Decoded::default();
    dec.decode(raw.as_bytes(), 0, false, &mut d);
    assert_eq!(d.msgs[0].time_ns, Some(1_709_288_430_000_000_001));
}

#[test]
fn the_fast_utc_path_agrees_with_the_general_parser() {
    for t in [
        "2024-03-01T10:20:30.123456789Z",
        "2024-03-01T10:20:30Z",
        "2024-02-29T23:59:59.5Z",
        "1999-12-31T00:00:00.000000001Z",
        "2026-11-23T12:20:47.9715223Z",
    ] {
        let general = timestamp::parse_any_prefix(t.as_bytes()).map(|(ns, _)| ns);
        assert_eq!(parse_utc_rfc3339(t.as_bytes()), general, "{t}");
    }
    for bad in [
        "2024-02-30T10:20:30Z",
        "2024-03-01T10:20:30.Z",
        "2024-03-01T10:20:30.1234567891Z",
        "2024-03-01T10:20:30+08:00",
        "2024-13-01T10:20:30Z",
        "2024-03-01 10:20:30Z",
    ] {
        assert_eq!(parse_utc_rfc3339(bad.as_bytes()), None, "{bad}");
    }
}
