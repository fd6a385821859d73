use super::*;

fn frames(input: &[u8], framing: Framing, max: usize, chunk: usize) -> (Vec<Vec<u8>>, u64, u64) {
    let (too_long, bad) = (LazyCounter::default(), LazyCounter::default());
    let mut s = SyslogSplitter::new(framing, max, too_long.clone(), bad.clone());
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut fed = 0;
    loop {
        let end = (fed + chunk).min(input.len());
        buf.extend_from_slice(&input[fed..end]);
        fed = end;
        let eof = fed == input.len();
        let mut spans = Vec::new();
        let used = s.split(&buf, eof, &mut spans);
        assert!(used <= buf.len());
        out.extend(spans.iter().map(|sp| sp.get(&buf).to_vec()));
        buf.drain(..used);
        if eof {
            break;
        }
    }
    (out, too_long.get(), bad.get())
}

#[test]
fn octet_counted_and_newline_frames_mix_under_auto_at_every_split() {
    let input = b"11 <13>1 - - x\n<14>plain line\r\n18 <15>has\nnewline in12 <16>12345678\n<17>end";
    let want: Vec<Vec<u8>> = vec![
        b"<13>1 - - x".to_vec(),
        b"<14>plain line".to_vec(),
        b"<15>has\nnewline in".to_vec(),
        b"<16>12345678".to_vec(),
        b"<17>end".to_vec(),
    ];
    for chunk in 1..=input.len() {
        let (got, too_long, bad) = frames(input, Framing::Auto, 1000, chunk);
        assert_eq!(got, want, "chunk {chunk}");
        assert_eq!((too_long, bad), (0, 0), "chunk {chunk}");
    }
}

#[test]
fn over_long_frames_are_cut_and_the_rest_skipped() {
    let mut input = b"30 ".to_vec();
    input.extend_from_slice(&[b'a'; 30]);
    input.extend_from_slice(b"5 short");
    input.extend_from_slice(&[b'b'; 25]);
    input.extend_from_slice(b"\n<1>next\n");
    for chunk in 1..=input.len() {
        let (got, too_long, _) = frames(&input, Framing::Auto, 10, chunk);
        assert_eq!(
            got,
            vec![
                vec![b'a'; 10],
                b"short".to_vec(),
                vec![b'b'; 10],
                b"<1>next".to_vec()
            ],
            "chunk {chunk}"
        );
        assert_eq!(too_long, 2, "chunk {chunk}");
    }
}

#[test]
fn a_bad_octet_count_resynchronises_at_the_next_newline() {
    let input = b"12345678901234 junk\n0 zero\n5x bad\n<13>ok\n";
    let (got, _, bad) = frames(input, Framing::Auto, 100, 7);
    assert_eq!(got, vec![b"<13>ok".to_vec()]);
    assert_eq!(bad, 3);
    // Strict octet counting: a newline frame is garbage too.
    let (got, _, bad) = frames(b"<13>x\n3 abc", Framing::OctetCounting, 100, 100);
    assert_eq!(got, vec![b"abc".to_vec()]);
    assert_eq!(bad, 1);
    // Strict newline framing: digits are just text.
    let (got, _, _) = frames(b"3 abc\n", Framing::Newline, 100, 100);
    assert_eq!(got, vec![b"3 abc".to_vec()]);
}

#[test]
fn random_streams_never_panic_and_stay_bounded() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..2000 {
        let len = (rnd() % 300) as usize;
        let input: Vec<u8> = (0..len)
            .map(|_| b"0123456789 \n<>ab"[(rnd() % 16) as usize])
            .collect();
        let chunk = 1 + (rnd() % 40) as usize;
        let (a, _, _) = frames(&input, Framing::Auto, 16, chunk);
        let (b, _, _) = frames(&input, Framing::Auto, 16, input.len().max(1));
        assert_eq!(a, b, "{:?}", String::from_utf8_lossy(&input));
        assert!(a.iter().all(|f| f.len() <= 16));
    }
}
