use super::*;

struct Want {
    fac: Option<u8>,
    sev: Option<u8>,
    ts: Option<&'static str>,
    host: Option<&'static str>,
    app: Option<&'static str>,
    pid: Option<&'static str>,
    msgid: Option<&'static str>,
    sd: &'static [(&'static str, &'static str, &'static str)],
    msg: &'static str,
}

const NONE: Want = Want {
    fac: None,
    sev: None,
    ts: None,
    host: None,
    app: None,
    pid: None,
    msgid: None,
    sd: &[],
    msg: "",
};

fn ns(rfc3339: &str) -> i64 {
    petrel_time::parse_any_prefix(rfc3339.as_bytes()).unwrap().0
}

fn check(input: &str, w: Want) {
    let f = input.as_bytes();
    let mut m = Message::default();
    parse(f, Format::Auto, &TimeZone::Utc, &mut m).unwrap_or_else(|e| panic!("{input}: {e:?}"));
    let s = |r: &Option<Range<usize>>| r.clone().map(|r| std::str::from_utf8(&f[r]).unwrap());
    assert_eq!(m.facility, w.fac, "{input}: facility");
    assert_eq!(m.severity, w.sev, "{input}: severity");
    assert_eq!(m.timestamp_ns, w.ts.map(ns), "{input}: timestamp");
    assert_eq!(s(&m.hostname), w.host, "{input}: hostname");
    assert_eq!(s(&m.app_name), w.app, "{input}: app_name");
    assert_eq!(s(&m.proc_id), w.pid, "{input}: proc_id");
    assert_eq!(s(&m.msg_id), w.msgid, "{input}: msg_id");
    let sd: Vec<(String, String, String)> =
        m.sd.iter()
            .map(|p| {
                let v = &f[p.value.clone()];
                let v = if p.escaped { unescape(v) } else { v.to_vec() };
                (
                    String::from_utf8_lossy(&f[p.id.clone()]).into_owned(),
                    String::from_utf8_lossy(&f[p.name.clone()]).into_owned(),
                    String::from_utf8(v).unwrap(),
                )
            })
            .collect();
    let want_sd: Vec<(String, String, String)> =
        w.sd.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect();
    assert_eq!(sd, want_sd, "{input}: sd");
    assert_eq!(
        std::str::from_utf8(&f[m.message.clone()]).unwrap(),
        w.msg,
        "{input}: message"
    );
}

#[test]
fn rfc5424_samples() {
    check(
        "<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - BOM'su root' failed for lonvick on /dev/pts/8",
        Want { fac: Some(4), sev: Some(2), ts: Some("2003-10-11T22:14:15.003Z"), host: Some("mymachine.example.com"), app: Some("su"), msgid: Some("ID47"), msg: "BOM'su root' failed for lonvick on /dev/pts/8", ..NONE },
    );
    check(
        "<165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time to make the do-nuts.",
        Want { fac: Some(20), sev: Some(5), ts: Some("2003-08-24T05:14:15.000003-07:00"), host: Some("192.0.2.1"), app: Some("myproc"), pid: Some("8710"), msg: "%% It's time to make the do-nuts.", ..NONE },
    );
    check(
        "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"] \u{feff}An application event log entry...",
        Want { fac: Some(20), sev: Some(5), ts: Some("2003-10-11T22:14:15.003Z"), host: Some("mymachine.example.com"), app: Some("evntslog"), msgid: Some("ID47"),
            sd: &[("exampleSDID@32473", "iut", "3"), ("exampleSDID@32473", "eventSource", "Application"), ("exampleSDID@32473", "eventID", "1011")],
            msg: "An application event log entry...", ..NONE },
    );
    check(
        "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut=\"3\"][examplePriority@32473 class=\"high\"]",
        Want { fac: Some(20), sev: Some(5), ts: Some("2003-10-11T22:14:15.003Z"), host: Some("mymachine.example.com"), app: Some("evntslog"), msgid: Some("ID47"),
            sd: &[("exampleSDID@32473", "iut", "3"), ("examplePriority@32473", "class", "high")], msg: "", ..NONE },
    );
    check(
        "<13>1 - - - - - -",
        Want {
            fac: Some(1),
            sev: Some(5),
            msg: "",
            ..NONE
        },
    );
    check(
        "<13>1 - - - - - - msg with trailing newline\r\n",
        Want {
            fac: Some(1),
            sev: Some(5),
            msg: "msg with trailing newline",
            ..NONE
        },
    );
    check(
        r#"<14>1 2024-01-02T03:04:05+08:00 h a 1 m [x@1 q="a \"quoted\" \\ and \] bracket" e=""] tail"#,
        Want {
            fac: Some(1),
            sev: Some(6),
            ts: Some("2024-01-02T03:04:05+08:00"),
            host: Some("h"),
            app: Some("a"),
            pid: Some("1"),
            msgid: Some("m"),
            sd: &[
                ("x@1", "q", r#"a "quoted" \ and ] bracket"#),
                ("x@1", "e", ""),
            ],
            msg: "tail",
        },
    );
    check(
        "<0>1 2024-01-02T03:04:05.123456789Z host app - - [meta] x",
        Want {
            fac: Some(0),
            sev: Some(0),
            ts: Some("2024-01-02T03:04:05.123456789Z"),
            host: Some("host"),
            app: Some("app"),
            msg: "x",
            ..NONE
        },
    );
    // What util-linux logger --rfc5424 sends.
    check(
        "<13>1 2024-05-06T07:08:09.123456+00:00 vm root 4242 - [timeQuality tzKnown=\"1\" isSynced=\"0\"] hello from logger",
        Want { fac: Some(1), sev: Some(5), ts: Some("2024-05-06T07:08:09.123456+00:00"), host: Some("vm"), app: Some("root"), pid: Some("4242"),
            sd: &[("timeQuality", "tzKnown", "1"), ("timeQuality", "isSynced", "0")], msg: "hello from logger", ..NONE },
    );
}

#[test]
fn rfc5424_errors() {
    let mut m = Message::default();
    for bad in [
        "<13>1 not-a-time h a p m - x",
        "<13>1 2024-01-02T03:04:05Z h a p m [unterminated x=\"1\" msg",
        "<13>1 2024-01-02T03:04:05Z h a p m [id x=1] msg",
        "<13>1 2024-01-02T03:04:05Z h a p m junk",
        "<13>1 2024-01-02T03:04:05Z h a",
    ] {
        assert!(
            parse(bad.as_bytes(), Format::Auto, &TimeZone::Utc, &mut m).is_err(),
            "{bad}"
        );
    }
    for bad in ["<>x", "<1234>x", "<192>x", "<13x", "<"] {
        assert_eq!(
            parse(bad.as_bytes(), Format::Auto, &TimeZone::Utc, &mut m),
            Err(ParseError::BadPri),
            "{bad}"
        );
    }
    assert!(parse(
        b"<13>Oct 11 22:14:15 h app: x",
        Format::Rfc5424,
        &TimeZone::Utc,
        &mut m
    )
    .is_err());
}

#[test]
fn rfc3164_samples() {
    let mut m = Message::default();
    let f = b"<34>Oct 11 22:14:15 mymachine su: 'su root' failed for lonvick on /dev/pts/8";
    parse(f, Format::Auto, &TimeZone::Utc, &mut m).unwrap();
    assert!(m.timestamp_ns.is_some());
    check_3164(
        f,
        Some(4),
        Some("mymachine"),
        Some("su"),
        None,
        "'su root' failed for lonvick on /dev/pts/8",
    );
    check_3164(
        b"<13>Oct  1 22:14:15 host app[123]: msg",
        Some(1),
        Some("host"),
        Some("app"),
        Some("123"),
        "msg",
    );
    // No hostname: the word after the time is the tag.
    check_3164(
        b"<13>Oct 11 22:14:15 app: msg",
        Some(1),
        None,
        Some("app"),
        None,
        "msg",
    );
    check_3164(
        b"<13>Oct 11 22:14:15 app[77]: msg",
        Some(1),
        None,
        Some("app"),
        Some("77"),
        "msg",
    );
    // Juniper.
    check_3164(
        b"<28>Mar 14 12:00:00 router mgd[1234]: UI_COMMIT: User 'root' requested 'commit'",
        Some(3),
        Some("router"),
        Some("mgd"),
        Some("1234"),
        "UI_COMMIT: User 'root' requested 'commit'",
    );
    // Cisco: sequence number, `*`, milliseconds, `%FAC-SEV-MNEMONIC`.
    check_3164(
        b"<189>123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: Configured from console by vty0",
        Some(23),
        None,
        None,
        None,
        "%SYS-5-CONFIG_I: Configured from console by vty0",
    );
    // RFC 3339 time (rsyslog forward format).
    check_3164(
        b"<13>2024-03-01T12:00:00Z host app: msg",
        Some(1),
        Some("host"),
        Some("app"),
        None,
        "msg",
    );
    // Tag directly followed by the message.
    check_3164(
        b"<13>Oct 11 22:14:15 host app:msg",
        Some(1),
        Some("host"),
        Some("app"),
        None,
        "msg",
    );
    // No PRI, no time: all message.
    check_3164(
        b"just some text: here",
        None,
        None,
        None,
        None,
        "just some text: here",
    );
    check_3164(b"tag: text", None, None, Some("tag"), None, "text");
    check_3164(
        b"no tag here at all",
        None,
        None,
        None,
        None,
        "no tag here at all",
    );
    check_3164(b"<13>", Some(1), None, None, None, "");
    check_3164(
        b"<13>garbage \xff\xfe bytes\n",
        Some(1),
        None,
        None,
        None,
        "garbage \u{fffd}\u{fffd} bytes",
    );
    // What util-linux logger sends by default over UDP/TCP (3164-ish with a year-less time).
    check_3164(
        b"<13>May  6 07:08:09 vm root[99]: hello",
        Some(1),
        Some("vm"),
        Some("root"),
        Some("99"),
        "hello",
    );
    check_3164(
        b"<13>May  6 07:08:09 root: hello",
        Some(1),
        None,
        Some("root"),
        None,
        "hello",
    );
}

fn check_3164(
    f: &[u8],
    fac: Option<u8>,
    host: Option<&str>,
    app: Option<&str>,
    pid: Option<&str>,
    msg: &str,
) {
    let mut m = Message::default();
    parse(f, Format::Auto, &TimeZone::Utc, &mut m).unwrap();
    let s = |r: &Option<Range<usize>>| {
        r.clone()
            .map(|r| String::from_utf8_lossy(&f[r]).into_owned())
    };
    let shown = String::from_utf8_lossy(f);
    assert_eq!(m.facility, fac, "{shown}");
    assert_eq!(s(&m.hostname).as_deref(), host, "{shown}: host");
    assert_eq!(s(&m.app_name).as_deref(), app, "{shown}: app");
    assert_eq!(s(&m.proc_id).as_deref(), pid, "{shown}: pid");
    assert_eq!(
        String::from_utf8_lossy(&f[m.message.clone()]),
        msg,
        "{shown}: message"
    );
}

#[test]
fn rfc3164_times_use_the_zone_and_infer_the_year() {
    let mut m = Message::default();
    let f = b"<13>Jan  2 03:04:05 host app: x";
    parse(f, Format::Rfc3164, &TimeZone::Fixed(8 * 3600), &mut m).unwrap();
    let utc = {
        let mut u = Message::default();
        parse(f, Format::Rfc3164, &TimeZone::Utc, &mut u).unwrap();
        u.timestamp_ns.unwrap()
    };
    assert_eq!(m.timestamp_ns.unwrap(), utc - 8 * 3600 * 1_000_000_000);
    // Never more than a week in the future.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(utc <= now + 8 * 86400 * 1_000_000_000);
}

#[test]
fn raw_format_keeps_the_frame() {
    let mut m = Message::default();
    parse(b"<13>1 - - - - - - x", Format::Raw, &TimeZone::Utc, &mut m).unwrap();
    assert_eq!(m.message, 0..19);
    assert_eq!(m.facility, None);
}

/// Random and mutated inputs: no panic, every range inside the input.
#[test]
fn arbitrary_input_never_panics() {
    let seeds: &[&[u8]] = &[
        b"<165>1 2003-10-11T22:14:15.003Z host app - ID47 [a@1 x=\"1\" y=\"\\\"\"][b z=\"]\"] msg",
        b"<189>123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: x",
        b"<13>Oct 11 22:14:15 host app[1]: msg",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut m = Message::default();
    for i in 0..200_000 {
        let mut f = seeds[i % seeds.len()].to_vec();
        let edits = rnd() % 6;
        for _ in 0..edits {
            let pos = (rnd() as usize) % (f.len() + 1);
            match rnd() % 3 {
                0 if pos < f.len() => f[pos] = rnd() as u8,
                1 => f.insert(pos, b"<>[]\"\\ =-1"[(rnd() % 10) as usize]),
                _ => f.truncate(pos),
            }
        }
        for format in [Format::Auto, Format::Rfc5424, Format::Rfc3164] {
            if parse(&f, format, &TimeZone::Utc, &mut m).is_ok() {
                for r in [&m.hostname, &m.app_name, &m.proc_id, &m.msg_id]
                    .into_iter()
                    .flatten()
                {
                    assert!(r.end <= f.len() && r.start <= r.end);
                }
                assert!(
                    m.message.end <= f.len() && m.message.start <= m.message.end,
                    "{f:?}"
                );
                for p in &m.sd {
                    assert!(p.value.end <= f.len() && p.name.end <= f.len());
                }
            }
        }
    }
}
