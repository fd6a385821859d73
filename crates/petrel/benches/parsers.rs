//! Engines for the three parsing processors, compared on the benchmark data
//! of `petrel gen` (1000 lines of 512 bytes per iteration; throughput is in
//! input bytes).
//!
//! - `regex512`: the `regex` crate (captures on `&str` and `&[u8]`,
//!   `captures_read` with reused locations, Unicode off) against PCRE2 with
//!   and without JIT, then the whole `parse_regex` processor.
//! - `json512`: one visitor building Petrel values, driven by `serde_json`,
//!   `sonic-rs` and `simd-json` (which parses in place, so it works on a
//!   copy of each line), plus generic DOMs for reference, then the whole
//!   `parse_json` processor.
//! - `delim512`: the memchr splitter against `split`, then the whole
//!   `parse_delimiter` processor.
//!
//! Run with `cargo bench -p petrel --bench parsers` (a few minutes; each
//! case runs ~2 s). Not part of the test suite.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput,
};
use petrel::processors::common::OnError;
use petrel::processors::parse_delimiter::{self, Extra, ParseDelimiter, Splitter};
use petrel::processors::parse_json::{self, JsonParser, ParseJson};
use petrel::processors::parse_regex::{self, ParseRegex, RegexMatcher};
use petrel_core::plugin::Processor;
use petrel_core::{Event, EventBatch, Metrics, SourceInfo, Span};
use petrel_gen::{DataSet, Generator};

const LINES: usize = 1000;

/// The CONTEXT.md regex with named groups.
const PATTERN: &str = r"\[(?P<time>[^]]+)]\s\[(?P<level>\w+)]\s\[(?P<pid>\d+)]\s(?P<file>\S+):(?P<line>\d+)\slog:(?P<log>.*)";

/// One buffer of `LINES` lines of `ds` and the span of each line (newline excluded).
fn data(ds: DataSet) -> (Bytes, Vec<Span>) {
    let mut buf = Vec::new();
    Generator::new(ds, 1).fill(&mut buf, LINES * ds.line_bytes());
    let mut spans = Vec::new();
    let mut start = 0;
    for i in memchr::memchr_iter(b'\n', &buf) {
        spans.push(Span::new(start, i - start));
        start = i + 1;
    }
    (Bytes::from(buf), spans)
}

fn group<'a>(c: &'a mut Criterion, name: &str, buf: &Bytes) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes(buf.len() as u64));
    g
}

fn batch(buf: &Bytes, spans: &[Span]) -> EventBatch {
    let mut b = EventBatch::new(
        buf.clone(),
        Arc::new(SourceInfo::file("/bench.log", Default::default())),
    );
    b.events = spans.iter().map(|s| Event::from_span(*s)).collect();
    b
}

/// The whole processor over one batch (the batch is rebuilt outside the timing).
fn bench_processor(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    p: &dyn Processor,
    buf: &Bytes,
    spans: &[Span],
) {
    g.bench_function(name, |b| {
        b.iter_batched_ref(
            || batch(buf, spans),
            |batch| p.process(batch),
            BatchSize::LargeInput,
        )
    });
}

fn metrics(kind: &str) -> petrel_core::ComponentMetrics {
    Metrics::new().component("bench", "processor", kind, kind)
}

fn regex512(c: &mut Criterion) {
    let (buf, spans) = data(DataSet::Regex512);
    let lines: Vec<&[u8]> = spans.iter().map(|s| s.get(&buf)).collect();
    let mut g = group(c, "regex512", &buf);

    let re = regex::bytes::Regex::new(PATTERN).expect("regex");
    g.bench_function("regex_bytes_captures", |b| {
        b.iter(|| {
            let mut n = 0;
            for l in &lines {
                if let Some(c) = re.captures(l) {
                    n += c.get(6).map_or(0, |m| m.end());
                }
            }
            black_box(n)
        })
    });
    let strs: Vec<&str> = lines
        .iter()
        .map(|l| std::str::from_utf8(l).expect("ascii"))
        .collect();
    let res = regex::Regex::new(PATTERN).expect("regex");
    g.bench_function("regex_str_captures", |b| {
        b.iter(|| {
            let mut n = 0;
            for l in &strs {
                if let Some(c) = res.captures(l) {
                    n += c.get(6).map_or(0, |m| m.end());
                }
            }
            black_box(n)
        })
    });
    let variants = [
        ("regex_bytes_captures_read", true),
        ("regex_bytes_ascii_captures_read", false),
    ]
    .map(|(name, unicode)| {
        let re = regex::bytes::RegexBuilder::new(PATTERN)
            .unicode(unicode)
            .build()
            .expect("regex");
        (name, re)
    });
    for (name, re) in variants {
        let mut locs = re.capture_locations();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0;
                for l in &lines {
                    if re.captures_read(&mut locs, l).is_some() {
                        n += locs.get(6).map_or(0, |m| m.1);
                    }
                }
                black_box(n)
            })
        });
    }
    for (name, jit) in [
        ("pcre2_captures_read", false),
        ("pcre2_jit_captures_read", true),
    ] {
        let re = pcre2::bytes::RegexBuilder::new()
            .jit(jit)
            .build(PATTERN)
            .expect("pcre2");
        let mut locs = re.capture_locations();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0;
                for l in &lines {
                    if let Ok(Some(_)) = re.captures_read(&mut locs, l) {
                        n += locs.get(6).map_or(0, |m| m.1);
                    }
                }
                black_box(n)
            })
        });
    }
    // What the processor runs per line: match plus building the six spans.
    let m = RegexMatcher::new(PATTERN).expect("pattern");
    let mut locs = m.scratch();
    let mut out = Vec::with_capacity(8);
    g.bench_function("petrel_matcher_to_values", |b| {
        b.iter(|| {
            for (l, s) in lines.iter().zip(&spans) {
                out.clear();
                let _ = m.captures(&mut locs, l, Some(s.start), &mut out);
            }
            black_box(out.len())
        })
    });
    let p = ParseRegex::new(
        &parse_regex::Config {
            field: "message".into(),
            pattern: PATTERN.into(),
            on_error: OnError::Keep,
        },
        metrics("parse_regex"),
    )
    .expect("build");
    bench_processor(&mut g, "petrel_parse_regex_processor", &p, &buf, &spans);
    g.finish();
}

fn json512(c: &mut Criterion) {
    let (buf, spans) = data(DataSet::Json512);
    let lines: Vec<&[u8]> = spans.iter().map(|s| s.get(&buf)).collect();
    let mut g = group(c, "json512", &buf);
    let parser = JsonParser::new(None);
    let mut out = Vec::with_capacity(8);

    g.bench_function("serde_json_to_values", |b| {
        b.iter(|| {
            for (l, s) in lines.iter().zip(&spans) {
                out.clear();
                let mut de = serde_json::Deserializer::from_slice(l);
                let _ = parser
                    .parse_with(&mut de, l, None, Some(s.start), &mut out)
                    .and_then(|()| de.end());
            }
            black_box(out.len())
        })
    });
    // `JsonParser::parse` is sonic-rs.
    g.bench_function("sonic_rs_to_values", |b| {
        b.iter(|| {
            for (l, s) in lines.iter().zip(&spans) {
                out.clear();
                let _ = parser.parse(l, Some(s.start), &mut out);
            }
            black_box(out.len())
        })
    });
    let mut copy = Vec::with_capacity(1024);
    let mut buffers = simd_json::Buffers::new(1024);
    g.bench_function("simd_json_copy_to_values", |b| {
        b.iter(|| {
            for (l, s) in lines.iter().zip(&spans) {
                out.clear();
                copy.clear();
                copy.extend_from_slice(l);
                let r = copy.as_ptr_range();
                let range = r.start as usize..r.end as usize;
                if let Ok(mut de) =
                    simd_json::Deserializer::from_slice_with_buffers(&mut copy, &mut buffers)
                {
                    let _ = parser.parse_with(&mut de, l, Some(range), Some(s.start), &mut out);
                }
            }
            black_box(out.len())
        })
    });
    // Generic DOMs with owned strings, for reference.
    g.bench_function("serde_json_value_dom", |b| {
        b.iter(|| {
            for l in &lines {
                black_box(serde_json::from_slice::<serde_json::Value>(l).ok());
            }
        })
    });
    g.bench_function("sonic_rs_value_dom", |b| {
        b.iter(|| {
            for l in &lines {
                black_box(sonic_rs::from_slice::<sonic_rs::Value>(l).ok());
            }
        })
    });
    let p = ParseJson::new(
        &parse_json::Config {
            field: "message".into(),
            flatten: false,
            separator: ".".into(),
            on_error: OnError::Keep,
        },
        metrics("parse_json"),
    )
    .expect("build");
    bench_processor(&mut g, "petrel_parse_json_processor", &p, &buf, &spans);
    g.finish();
}

fn delim512(c: &mut Criterion) {
    let (buf, spans) = data(DataSet::Delim512);
    let lines: Vec<&[u8]> = spans.iter().map(|s| s.get(&buf)).collect();
    let mut g = group(c, "delim512", &buf);

    g.bench_function("slice_splitn", |b| {
        b.iter(|| {
            let mut n = 0;
            for l in &lines {
                n += l.splitn(6, |&c| c == b'|').map(<[u8]>::len).sum::<usize>();
            }
            black_box(n)
        })
    });
    let mut parts = Vec::with_capacity(8);
    for (name, quote) in [
        ("memchr_splitter_quoted", Some(b'"')),
        ("memchr_splitter_unquoted", None),
    ] {
        let s = Splitter::new(b"|", quote, 6, Extra::Last);
        g.bench_function(name, |b| {
            b.iter(|| {
                for l in &lines {
                    parts.clear();
                    let _ = s.split(l, &mut parts);
                }
                black_box(parts.len())
            })
        });
    }
    let p = ParseDelimiter::new(
        &parse_delimiter::Config {
            field: "message".into(),
            separator: b"|".to_vec(),
            quote: Some(b'"'),
            keys: ["time", "level", "pid", "file", "line", "log"]
                .map(String::from)
                .to_vec(),
            extra: Extra::Last,
            on_error: OnError::Keep,
        },
        metrics("parse_delimiter"),
    )
    .expect("build");
    bench_processor(&mut g, "petrel_parse_delimiter_processor", &p, &buf, &spans);
    g.finish();
}

criterion_group!(benches, regex512, json512, delim512);
criterion_main!(benches);
