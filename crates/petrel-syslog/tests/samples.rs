//! Real-world-style syslog lines through `parse`, asserting every field.
//!
//! Each message is rendered to one line (`render`) that names every field,
//! so a table row states the complete expected result.

use petrel_syslog::{parse, Context, Flavor, Format, Message, ParseError, Range};
use petrel_time::{days_from_civil, TimeZone};

const NS: i64 = 1_000_000_000;

/// 2025-06-15T12:00:00Z, "now" for year inference.
fn now_ns() -> i64 {
    (days_from_civil(2025, 6, 15) * 86_400 + 12 * 3600) * NS
}

fn ctx() -> Context {
    Context {
        tz: TimeZone::Utc,
        now_ns: now_ns(),
    }
}

fn text(frame: &[u8], r: &Range) -> String {
    let b = frame.get(r.clone()).expect("range within the frame");
    // Printable ASCII as it is (quotes and backslashes included, so
    // expectations read like the input), anything else as \xNN.
    b.iter()
        .map(|&c| match c {
            0x20..=0x7e => char::from(c).to_string(),
            _ => format!("\\x{c:02x}"),
        })
        .collect()
}

fn opt(frame: &[u8], r: &Option<Range>) -> String {
    match r {
        Some(r) => text(frame, r),
        None => "-".into(),
    }
}

/// One line naming every field of `m`.
fn render(frame: &[u8], m: &Message) -> String {
    let flavor = match m.flavor {
        Some(Flavor::Rfc5424) => "5424",
        Some(Flavor::Rfc3164) => "3164",
        None => "none",
    };
    let pri = match (m.facility, m.severity) {
        (Some(f), Some(s)) => format!("{f}/{s}"),
        (None, None) => "-".into(),
        other => panic!("facility and severity disagree: {other:?}"),
    };
    let ts = match m.timestamp_ns {
        Some(ns) => {
            let mut v = Vec::new();
            petrel_time::write_rfc3339(ns, &mut v);
            String::from_utf8(v).unwrap()
        }
        None => "-".into(),
    };
    let mut sd = String::new();
    for id in &m.sd_ids {
        sd.push('[');
        sd.push_str(&text(frame, id));
        for p in m.sd.iter().filter(|p| p.id == *id) {
            sd.push_str(&format!(
                " {}=\"{}\"{}",
                text(frame, &p.name),
                text(frame, &p.value),
                if p.escaped { "*" } else { "" }
            ));
        }
        sd.push(']');
    }
    for p in &m.sd {
        assert!(m.sd_ids.contains(&p.id), "param of an unlisted SD-ID");
    }
    if sd.is_empty() {
        sd.push('-');
    }
    format!(
        "{flavor} pri={pri} ts={ts} host={} app={} pid={} mid={} sd={sd} msg={}",
        opt(frame, &m.hostname),
        opt(frame, &m.app_name),
        opt(frame, &m.proc_id),
        opt(frame, &m.msg_id),
        text(frame, &m.message),
    )
}

fn run(frame: &[u8], format: Format, ctx: &Context) -> Result<String, ParseError> {
    // A dirty, reused Message: parse must clear it.
    let mut m = Message::default();
    let junk = b"<13>1 2024-01-01T00:00:00Z h a p m [j k=\"v\"] junk";
    parse(junk, Format::Auto, ctx, &mut m).unwrap();
    parse(frame, format, ctx, &mut m).map(|()| render(frame, &m))
}

/// (input, format, expected rendering or error)
type Row = (&'static [u8], Format, Result<&'static str, ParseError>);

const A: Format = Format::Auto;

fn rows() -> Vec<Row> {
    use ParseError::*;
    vec![
        // --- RFC 5424, the RFC's own examples -------------------------------
        (
            b"<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - \xEF\xBB\xBF'su root' failed for lonvick on /dev/pts/8",
            A,
            Ok("5424 pri=4/2 ts=2003-10-11T22:14:15.003000000Z host=mymachine.example.com app=su pid=- mid=ID47 sd=- msg='su root' failed for lonvick on /dev/pts/8"),
        ),
        (
            b"<165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time to make the do-nothing.",
            A,
            Ok("5424 pri=20/5 ts=2003-08-24T12:14:15.000003000Z host=192.0.2.1 app=myproc pid=8710 mid=- sd=- msg=%% It's time to make the do-nothing."),
        ),
        (
            b"<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"] \xEF\xBB\xBFAn application event log entry...",
            A,
            Ok("5424 pri=20/5 ts=2003-10-11T22:14:15.003000000Z host=mymachine.example.com app=evntslog pid=- mid=ID47 sd=[exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"] msg=An application event log entry..."),
        ),
        // SD only, several elements, no MSG.
        (
            b"<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"][examplePriority@32473 class=\"high\"]",
            A,
            Ok("5424 pri=20/5 ts=2003-10-11T22:14:15.003000000Z host=mymachine.example.com app=evntslog pid=- mid=ID47 sd=[exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"][examplePriority@32473 class=\"high\"] msg="),
        ),
        // --- RFC 5424, more shapes --------------------------------------------
        // Escapes in values; another backslash stays literal.
        (
            br#"<13>1 2024-03-01T12:00:00Z h a p m [x@1 k="a\"b\\c\]d" e="\n" f=""] msg"#,
            A,
            Ok(r#"5424 pri=1/5 ts=2024-03-01T12:00:00.000000000Z host=h app=a pid=p mid=m sd=[x@1 k="a\"b\\c\]d"* e="\n" f=""] msg=msg"#),
        ),
        // Elements without parameters, and a repeated SD-ID.
        (
            br#"<14>1 2024-03-01T12:00:00.5+05:30 host app 42 - [origin][meta sequenceId="1"][meta sequenceId="2" sysUpTime="37"] up"#,
            A,
            Ok(r#"5424 pri=1/6 ts=2024-03-01T06:30:00.500000000Z host=host app=app pid=42 mid=- sd=[origin][meta sequenceId="1"][meta sequenceId="2" sysUpTime="37"] msg=up"#),
        ),
        // Nil everywhere, no MSG.
        (
            b"<13>1 - - - - - -",
            A,
            Ok("5424 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg="),
        ),
        // Nil everywhere, MSG, CRLF and NULs trimmed.
        (
            b"<0>1 - - - - - - hello world \r\n\0",
            A,
            Ok("5424 pri=0/0 ts=- host=- app=- pid=- mid=- sd=- msg=hello world "),
        ),
        // A BOM alone, and a MSG that is only a space.
        (
            b"<191>1 - - - - - - \xEF\xBB\xBF",
            A,
            Ok("5424 pri=23/7 ts=- host=- app=- pid=- mid=- sd=- msg="),
        ),
        (
            b"<13>1 - - - - - -  ",
            A,
            Ok("5424 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg= "),
        ),
        // Invalid UTF-8 in MSG and in a value: not validated.
        (
            b"<13>1 2024-03-01T12:00:00Z h a - - [x v=\"\xff\"] \xff\xfe bytes",
            A,
            Ok("5424 pri=1/5 ts=2024-03-01T12:00:00.000000000Z host=h app=a pid=- mid=- sd=[x v=\"\\xff\"] msg=\\xff\\xfe bytes"),
        ),
        // 9 fraction digits and lower-case t/z; a leap second.
        (
            b"<13>1 2024-12-31t23:59:60.123456789z h - - - - x",
            A,
            Ok("5424 pri=1/5 ts=2025-01-01T00:00:00.123456789Z host=h app=- pid=- mid=- sd=- msg=x"),
        ),
        // Format::Rfc5424 takes another version number.
        (
            b"<13>2 - - - - - - v2",
            Format::Rfc5424,
            Ok("5424 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg=v2"),
        ),
        // A time outside what i64 nanoseconds hold: no timestamp, no error.
        (
            b"<13>1 2300-01-01T00:00:00Z h - - - - far",
            A,
            Ok("5424 pri=1/5 ts=- host=h app=- pid=- mid=- sd=- msg=far"),
        ),
        // Errors.
        (b"<13>1 2024-03-01T12:00:00Z h a - - [x k=\"v] msg", A, Err(BadStructuredData)),
        (b"<13>1 2024-03-01T12:00:00Z h a - - [x k=\"a]b\"] msg", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - [x k=v] msg", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - [x k=\"v\"", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - [x k=\"v\"]x", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - [] m", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - [x =\"v\"] m", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - -x", A, Err(BadStructuredData)),
        (b"<13>1 - h a - - msg", A, Err(BadStructuredData)),
        (b"<13>1 - h a - -", A, Err(BadStructuredData)),
        (b"<13>1 - h a - ", A, Err(BadHeader("msgid"))),
        (b"<13>1 2024-03-01T12:00:00Z host", A, Err(BadHeader("app-name"))),
        (b"<13>1 2024-13-01T12:00:00Z h a - - - m", A, Err(BadHeader("timestamp"))),
        (b"<13>1 Oct 11 22:14:15 h a - - - m", A, Err(BadHeader("timestamp"))),
        (b"<13>1  - h a - - - m", A, Err(BadHeader("timestamp"))),
        (b"<13>1 - h  a - - - m", A, Err(BadHeader("app-name"))),
        (b"<34>Oct 11 22:14:15 host su: x", Format::Rfc5424, Err(BadHeader("version"))),
        (b"<13>01 - - - - - -", Format::Rfc5424, Err(BadHeader("version"))),
        (b"1 - - - - - -", Format::Rfc5424, Err(BadPri)),
        // --- RFC 3164 -------------------------------------------------------
        (
            b"<34>Oct 11 22:14:15 mymachine su: 'su root' failed for lonvick on /dev/pts/8",
            A,
            Ok("3164 pri=4/2 ts=2024-10-11T22:14:15.000000000Z host=mymachine app=su pid=- mid=- sd=- msg='su root' failed for lonvick on /dev/pts/8"),
        ),
        // Space-padded day, tag with pid.
        (
            b"<34>Oct  1 22:14:15 host app[123]: msg\n",
            A,
            Ok("3164 pri=4/2 ts=2024-10-01T22:14:15.000000000Z host=host app=app pid=123 mid=- sd=- msg=msg"),
        ),
        // No hostname: the word after the time is the tag.
        (
            b"<13>Jun 15 11:00:00 app: msg",
            A,
            Ok("3164 pri=1/5 ts=2025-06-15T11:00:00.000000000Z host=- app=app pid=- mid=- sd=- msg=msg"),
        ),
        (
            b"<13>Jun 15 11:00:00 app[42]: msg",
            A,
            Ok("3164 pri=1/5 ts=2025-06-15T11:00:00.000000000Z host=- app=app pid=42 mid=- sd=- msg=msg"),
        ),
        // Cisco IOS: sequence number, `*`, fraction, colon after the time,
        // the mnemonic kept in the message.
        (
            b"<189>123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: Configured from console by console",
            A,
            Ok("3164 pri=23/5 ts=2025-03-01T18:46:11.123000000Z host=- app=- pid=- mid=- sd=- msg=%SYS-5-CONFIG_I: Configured from console by console"),
        ),
        // Cisco with the year and a zone.
        (
            b"<187>45: Feb 28 2024 23:10:01.5 UTC: %LINK-3-UPDOWN: Interface Gi0/1, changed state to down",
            Format::Rfc3164,
            Ok("3164 pri=23/3 ts=2024-02-28T23:10:01.500000000Z host=- app=- pid=- mid=- sd=- msg=%LINK-3-UPDOWN: Interface Gi0/1, changed state to down"),
        ),
        // Juniper.
        (
            b"<28>Mar 14 12:00:00 router mgd[1234]: UI_COMMIT: User 'root' requested 'commit' operation",
            A,
            Ok("3164 pri=3/4 ts=2025-03-14T12:00:00.000000000Z host=router app=mgd pid=1234 mid=- sd=- msg=UI_COMMIT: User 'root' requested 'commit' operation"),
        ),
        // RFC 3339 time in a 3164 line (rsyslog's forwarding format).
        (
            b"<13>2024-03-01T12:00:00Z host app: msg",
            A,
            Ok("3164 pri=1/5 ts=2024-03-01T12:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=msg"),
        ),
        (
            b"<30>2024-03-01T12:00:00.123456+01:00 web01 nginx[77]: GET / 200",
            A,
            Ok("3164 pri=3/6 ts=2024-03-01T11:00:00.123456000Z host=web01 app=nginx pid=77 mid=- sd=- msg=GET / 200"),
        ),
        // Tag without pid, a `[` later in the message.
        (
            b"<6>Jun  1 08:00:00 node1 kernel: [    0.000000] Linux version 6.1",
            A,
            Ok("3164 pri=0/6 ts=2025-06-01T08:00:00.000000000Z host=node1 app=kernel pid=- mid=- sd=- msg=[    0.000000] Linux version 6.1"),
        ),
        // `app:` directly followed by the message.
        (
            b"<13>Jun  1 08:00:00 host app:msg",
            A,
            Ok("3164 pri=1/5 ts=2025-06-01T08:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=msg"),
        ),
        // A tag with a slash (postfix).
        (
            b"<22>Jun 14 10:00:00 mail postfix/smtpd[1234]: connect from unknown[192.0.2.1]",
            A,
            Ok("3164 pri=2/6 ts=2025-06-14T10:00:00.000000000Z host=mail app=postfix/smtpd pid=1234 mid=- sd=- msg=connect from unknown[192.0.2.1]"),
        ),
        // No PRI.
        (
            b"Jun 14 10:00:00 host app: msg",
            A,
            Ok("3164 pri=- ts=2025-06-14T10:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=msg"),
        ),
        // PRI only.
        (b"<13>", A, Ok("3164 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg=")),
        // Garbage.
        (
            b"hello world",
            A,
            Ok("3164 pri=- ts=- host=- app=- pid=- mid=- sd=- msg=hello world"),
        ),
        (
            b"\x00\x01\x02 ]]] [[[",
            A,
            Ok("3164 pri=- ts=- host=- app=- pid=- mid=- sd=- msg=\\x00\\x01\\x02 ]]] [[["),
        ),
        // Invalid UTF-8.
        (
            b"<13>Jun 14 10:00:00 h\xc3 app: \xff\xfe",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=h\\xc3 app=app pid=- mid=- sd=- msg=\\xff\\xfe"),
        ),
        // A tag but no time: no hostname is looked for.
        (
            b"<13>app[1]: hello",
            A,
            Ok("3164 pri=1/5 ts=- host=- app=app pid=1 mid=- sd=- msg=hello"),
        ),
        // An impossible date: no timestamp, everything is the message.
        (
            b"<13>Feb 30 10:00:00 host app: x",
            A,
            Ok("3164 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg=Feb 30 10:00:00 host app: x"),
        ),
        // A numeric zone after the time.
        (
            b"<13>Mar  1 18:46:11 +01:00 host app: x",
            A,
            Ok("3164 pri=1/5 ts=2025-03-01T17:46:11.000000000Z host=host app=app pid=- mid=- sd=- msg=x"),
        ),
        // One word after the time: the message.
        (
            b"<13>Jun 14 10:00:00 restarting",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=- app=- pid=- mid=- sd=- msg=restarting"),
        ),
        // A URL is not a tag.
        (
            b"<13>Jun 14 10:00:00 host http://example.com/ is down",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=host app=- pid=- mid=- sd=- msg=http://example.com/ is down"),
        ),
        // A space inside the brackets: not a tag.
        (
            b"<13>Jun 14 10:00:00 host app[1 2]: x",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=host app=- pid=- mid=- sd=- msg=app[1 2]: x"),
        ),
        // A space after PRI, extra spaces between fields, `app[]`.
        (
            b"<13> Jun 14 10:00:00  host  app[]: x",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=x"),
        ),
        // ISO time without an offset, space separated.
        (
            b"<13>2024-03-01 12:00:00,250 host app: x",
            A,
            Ok("3164 pri=1/5 ts=2024-03-01T12:00:00.250000000Z host=host app=app pid=- mid=- sd=- msg=x"),
        ),
        // Format::Rfc3164 on an RFC 5424 line: all message.
        (
            b"<13>1 - - - - - - x",
            Format::Rfc3164,
            Ok("3164 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg=1 - - - - - - x"),
        ),
        // `<PRI>1` without the space is not RFC 5424 for Auto.
        (
            b"<13>1",
            A,
            Ok("3164 pri=1/5 ts=- host=- app=- pid=- mid=- sd=- msg=1"),
        ),
        // Cisco ASA with an IP address as hostname, and without a header.
        (
            b"<190>Jun 14 10:00:00 10.0.0.1 %ASA-6-302013: Built outbound TCP connection",
            A,
            Ok("3164 pri=23/6 ts=2025-06-14T10:00:00.000000000Z host=10.0.0.1 app=- pid=- mid=- sd=- msg=%ASA-6-302013: Built outbound TCP connection"),
        ),
        (
            b"<166>%ASA-6-302013: Built",
            A,
            Ok("3164 pri=20/6 ts=- host=- app=- pid=- mid=- sd=- msg=%ASA-6-302013: Built"),
        ),
        // FortiGate key=value: no header at all.
        (
            b"<189>date=2024-03-01 time=12:00:00 devname=fw1 type=traffic",
            A,
            Ok("3164 pri=23/5 ts=- host=- app=- pid=- mid=- sd=- msg=date=2024-03-01 time=12:00:00 devname=fw1 type=traffic"),
        ),
        // sudo's padded message; a tag with pid but no colon.
        (
            b"<86>Jun 14 10:00:00 host sudo:   alice : TTY=pts/0",
            A,
            Ok("3164 pri=10/6 ts=2025-06-14T10:00:00.000000000Z host=host app=sudo pid=- mid=- sd=- msg=  alice : TTY=pts/0"),
        ),
        (
            b"<13>Jun 14 10:00:00 host app[12] <Notice>: msg",
            A,
            Ok("3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=host app=app pid=12 mid=- sd=- msg=<Notice>: msg"),
        ),
        // Bad PRI and empty frames.
        (b"<13 hello", A, Err(BadPri)),
        (b"<192>Oct 11 22:14:15 h a: x", A, Err(BadPri)),
        (b"<1234>x", Format::Rfc3164, Err(BadPri)),
        (b"<>x", A, Err(BadPri)),
        (b"<", A, Err(BadPri)),
        (b"", A, Err(Empty)),
        (b"\r\n\0", A, Err(Empty)),
    ]
}

#[test]
fn sample_table() {
    let ctx = ctx();
    let mut failures = Vec::new();
    let rows = rows();
    assert!(rows.len() >= 30);
    for (input, format, want) in rows {
        let got = run(input, format, &ctx);
        let want = want.map(str::to_owned);
        if got != want {
            failures.push(format!(
                "input: {}\n  want: {want:?}\n  got:  {got:?}",
                input.escape_ascii()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn max_length_fields() {
    let host = "h".repeat(255);
    let app = "a".repeat(48);
    let pid = "p".repeat(128);
    let mid = "m".repeat(32);
    let sd_id = "i".repeat(32);
    let name = "n".repeat(32);
    let line =
        format!("<13>1 2024-03-01T12:00:00Z {host} {app} {pid} {mid} [{sd_id} {name}=\"v\"] x");
    let got = run(line.as_bytes(), A, &ctx()).unwrap();
    assert_eq!(
        got,
        format!("5424 pri=1/5 ts=2024-03-01T12:00:00.000000000Z host={host} app={app} pid={pid} mid={mid} sd=[{sd_id} {name}=\"v\"] msg=x")
    );
    // Longer than the RFC's limits is accepted (real senders exceed them).
    let app = "a".repeat(100);
    let line = format!("<13>1 - - {app} - - - x");
    assert!(run(line.as_bytes(), A, &ctx()).unwrap().contains(&app));
}

#[test]
fn errors_keep_the_header() {
    let frame = b"<13>1 2024-03-01T12:00:00Z host app - - [x k=\"v\"][y";
    let mut m = Message::default();
    assert_eq!(
        parse(frame, A, &ctx(), &mut m),
        Err(ParseError::BadStructuredData)
    );
    assert_eq!(m.hostname, Some(27..31));
    assert_eq!(m.flavor, None);
    assert_eq!(
        ParseError::BadHeader("hostname").to_string(),
        "invalid RFC 5424 header field hostname"
    );
}

#[test]
fn time_zone_for_3164() {
    let ctx = Context {
        tz: TimeZone::Fixed(2 * 3600),
        now_ns: now_ns(),
    };
    assert_eq!(
        run(b"<13>Jun 14 10:00:00 host app: x", A, &ctx).unwrap(),
        "3164 pri=1/5 ts=2025-06-14T08:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=x"
    );
    // An explicit zone wins over the context's; RFC 5424 always has one.
    assert_eq!(
        run(b"<13>Jun 14 10:00:00 GMT host app: x", A, &ctx).unwrap(),
        "3164 pri=1/5 ts=2025-06-14T10:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=x"
    );
    assert_eq!(
        run(b"<13>1 2024-03-01T12:00:00Z - - - - - x", A, &ctx).unwrap(),
        "5424 pri=1/5 ts=2024-03-01T12:00:00.000000000Z host=- app=- pid=- mid=- sd=- msg=x"
    );
    let named = Context {
        tz: TimeZone::from_name("Europe/Paris").unwrap(),
        now_ns: now_ns(),
    };
    // Summer time: UTC+2.
    assert_eq!(
        run(b"<13>Jun 14 10:00:00 host app: x", A, &named).unwrap(),
        "3164 pri=1/5 ts=2025-06-14T08:00:00.000000000Z host=host app=app pid=- mid=- sd=- msg=x"
    );
}

/// The year of an RFC 3164 time is the one that puts it at most a day
/// after "now" (and so never more than a day in the future).
#[test]
fn year_inference() {
    let at = |line: &[u8], (y, m, d, h, min): (i64, u32, u32, i64, i64), tz: TimeZone| {
        let now = (days_from_civil(y, m, d) * 86_400 + h * 3600 + min * 60) * NS;
        let ctx = Context { tz, now_ns: now };
        let mut msg = Message::default();
        parse(line, A, &ctx, &mut msg).unwrap();
        let mut v = Vec::new();
        petrel_time::write_rfc3339(msg.timestamp_ns.unwrap(), &mut v);
        String::from_utf8(v).unwrap()
    };
    let utc = || TimeZone::Utc;
    // A 31 December message received on 1 January: last year.
    assert_eq!(
        at(b"<13>Dec 31 23:59:59 h a: x", (2025, 1, 1, 0, 0), utc()),
        "2024-12-31T23:59:59.000000000Z"
    );
    // A 1 January message received 12 h before the new year: next year.
    assert_eq!(
        at(b"<13>Jan  1 00:00:00 h a: x", (2024, 12, 31, 12, 0), utc()),
        "2025-01-01T00:00:00.000000000Z"
    );
    // ...but not when it would be more than a day ahead.
    assert_eq!(
        at(b"<13>Jan  2 12:00:01 h a: x", (2024, 12, 31, 12, 0), utc()),
        "2024-01-02T12:00:01.000000000Z"
    );
    // Mid-year: up to a day ahead stays this year, more goes back a year.
    assert_eq!(
        at(b"<13>Jun 16 11:59:59 h a: x", (2025, 6, 15, 12, 0), utc()),
        "2025-06-16T11:59:59.000000000Z"
    );
    assert_eq!(
        at(b"<13>Jun 16 12:00:01 h a: x", (2025, 6, 15, 12, 0), utc()),
        "2024-06-16T12:00:01.000000000Z"
    );
    // A sender 14 h ahead of UTC already in the new year.
    assert_eq!(
        at(
            b"<13>Jan  1 00:30:00 h a: x",
            (2024, 12, 31, 10, 0),
            TimeZone::Fixed(14 * 3600)
        ),
        "2024-12-31T10:30:00.000000000Z"
    );
    // 29 February read in a non-leap year: the last leap year.
    assert_eq!(
        at(b"<13>Feb 29 10:00:00 h a: x", (2025, 3, 5, 0, 0), utc()),
        "2024-02-29T10:00:00.000000000Z"
    );
}

#[test]
fn sd_ranges_and_unescape() {
    let frame = br#"<13>1 - - - - - [a@1 k="x\]y" n="plain"] m"#;
    let mut m = Message::default();
    parse(frame, A, &ctx(), &mut m).unwrap();
    assert_eq!(m.sd.len(), 2);
    let p = &m.sd[0];
    assert!(p.escaped);
    assert_eq!(
        &*petrel_syslog::unescape_sd_value(&frame[p.value.clone()]),
        b"x]y"
    );
    assert!(!m.sd[1].escaped);
    assert_eq!(&frame[m.sd_ids[0].clone()], b"a@1");
}
