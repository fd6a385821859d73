"""The agents of the headline benchmark (bench/headline.py) and of the
pipelines row of bench/kubernetes.py: how each one is configured to tail
files into a file on tmpfs, with its own parsers, and how its output is
counted. Python standard library only; imported, not run.

Each agent writes one config into a work directory and returns the
command that runs it. The config asks for the same work of every agent:

  raw        lines → a file, as they are (Petrel `text`, Fluent Bit
             `template {log}`, Vector `text`; the Collector has no raw
             writer in its build: its file exporter writes OTLP JSON)
  regex512, json512, delim512
             each line parsed into six fields by the agent's own parser →
             one JSON object per event (Petrel parse_regex / parse_json /
             parse_delimiter; Fluent Bit regex and json parsers, its
             delimiter as a regex since it has no delimiter parser; Vector
             remap parse_regex / parse_json / split; the Collector's
             filelog operators regex_parser / json_parser / csv_parser)
  multiline512
             23-line events joined by a start pattern (`^\\[\\d{4}-`) →
             one JSON object per event (Petrel `multiline.start_pattern`,
             Fluent Bit a regex multiline parser, Vector `multiline`
             halt_before, the Collector `multiline.line_start_pattern`)

Everything else is each agent's default (threads, batch sizes, read
sizes, buffers), except where a default would measure a timer instead of
the work: Fluent Bit's flush interval and the Collector's file exporter
flush interval go from 1 s to 200 ms (both only decide when the last
events of a run are written), and the Collector's internal metrics are
off (their port would clash between runs). With many inputs (the
pipelines row) Fluent Bit's tail inputs use the stat watcher: each would
open an inotify instance of its own, and a user gets 128. `marker` is the byte string that occurs once
per event in the output: a newline, or for the Collector's OTLP JSON the
`"observedTimeUnixNano"` key of each log record.
"""

import json
import os
import subprocess

# The regex of CONTEXT.md, with names: the same groups for every agent.
REGEX512 = (r"^\[(?<time>[^\]]+)\]\s\[(?<level>\w+)\]\s\[(?<pid>\d+)\]\s(?<file>\S+):"
            r"(?<line>\d+)\slog:(?<log>.*)$")
DELIM_KEYS = ["time", "level", "pid", "file", "line", "log"]
# Fluent Bit has regex, json, logfmt and ltsv parsers, no delimiter parser.
DELIM512_AS_REGEX = "^" + r"\|".join(f"(?<{k}>[^|]*)" for k in DELIM_KEYS[:-1]) + r"\|(?<log>.*)$"
START = r"^\[\d{4}-"
PARSES = ("regex512", "json512", "delim512", "multiline512")


def _version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0].strip() if text else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


class Agent:
    name = "?"
    label = "?"
    marker = b"\n"
    # What a reader must know to read this agent's figures (the report
    # prints it under the tables).
    note = None

    def __init__(self, binary):
        self.bin = binary

    def version(self):
        return _version([self.bin, "--version"])

    def env(self):
        return None

    def command(self, workdir, inputs, output, parse=None):
        """Writes the config for `inputs` (paths or globs; one input, or
        source, per entry) into `workdir` and returns the argv. `parse` is
        None (raw lines) or one of PARSES."""
        raise NotImplementedError


class Petrel(Agent):
    """`petrel run` with its defaults (--threads = cores); one pipeline per
    input, each into its own file sink (the headline has one input)."""
    name, label = "petrel", "Petrel"

    def command(self, workdir, inputs, output, parse=None):
        import petrel_bench  # bench/petrel_bench.py: the pipelines of bench/run.sh
        sink = "ndjson" if parse else "text"
        if len(inputs) == 1:
            cfg = os.path.join(workdir, "pipeline.yaml")
            petrel_bench.write_pipeline(cfg, inputs[0], sink, "beginning", parse, output)
        else:
            # A config directory: one pipeline per file, each its own sink
            # file (output.N); the idle ones never write.
            cfg = os.path.join(workdir, "pipelines")
            os.makedirs(cfg, exist_ok=True)
            for i, path in enumerate(inputs):
                petrel_bench.write_pipeline(os.path.join(cfg, f"p{i:04}.yaml"), path, sink,
                                            "beginning", parse, f"{output}.{i}")
        return [self.bin, "run", "--config", cfg, "--data-dir", os.path.join(workdir, "data"),
                "--api-addr", "127.0.0.1:0", "--log-level", "warn"]


class FluentBit(Agent):
    """Fluent Bit, classic config: tail (Read_from_Head) → file."""
    name, label = "fluent-bit", "Fluent Bit"

    def command(self, workdir, inputs, output, parse=None):
        parsers = os.path.join(workdir, "parsers.conf")
        with open(parsers, "w") as f:
            f.write("[PARSER]\n    Name   bench_regex512\n    Format regex\n"
                    f"    Regex  {REGEX512}\n\n"
                    "[PARSER]\n    Name   bench_json512\n    Format json\n\n"
                    "[PARSER]\n    Name   bench_delim512\n    Format regex\n"
                    f"    Regex  {DELIM512_AS_REGEX}\n\n"
                    "[MULTILINE_PARSER]\n    name          bench_multiline512\n"
                    "    type          regex\n    flush_timeout 1000\n"
                    f"    rule \"start_state\" \"/{START}/\" \"cont\"\n"
                    "    rule \"cont\" \"/^\\s+at /\" \"cont\"\n")
        conf = os.path.join(workdir, "fluent-bit.conf")
        with open(conf, "w") as f:
            f.write("[SERVICE]\n    Flush        0.2\n    Log_Level    warn\n"
                    f"    Parsers_File {parsers}\n    HTTP_Server  Off\n\n")
            for i, path in enumerate(inputs):
                f.write(f"[INPUT]\n    Name           tail\n    Tag            in.{i}\n"
                        f"    Path           {path}\n    Read_from_Head On\n")
                if len(inputs) > 64:
                    # Each tail input opens an inotify instance of its own,
                    # and a user gets 128 (fs.inotify.max_user_instances):
                    # many inputs run on the stat watcher instead.
                    f.write("    Inotify_Watcher false\n")
                if parse == "multiline512":
                    f.write("    multiline.parser bench_multiline512\n")
                elif parse:
                    f.write(f"    Parser         bench_{parse}\n")
                f.write("\n")
            fmt = "    Format   plain\n" if parse else "    Format   template\n    Template {log}\n"
            f.write(f"[OUTPUT]\n    Name     file\n    Match    *\n"
                    f"    Path     {os.path.dirname(output)}\n    File     {os.path.basename(output)}\n"
                    + fmt)
        return [self.bin, "-c", conf]


class Vector(Agent):
    """Vector: file source (read_from beginning) → remap → file sink."""
    name, label = "vector", "Vector"
    note = ("Vector's file sink writes each event with a write of its own through Tokio's "
            "asynchronous file (src/sinks/file/mod.rs, `write_event_to_file`), which bounds "
            "its rows here; its blackhole sink reads several times faster.")

    REMAP = {
        "regex512": ". = merge(., parse_regex!(.message, r'%s'))" % REGEX512,
        "json512": ". = merge(., object!(parse_json!(.message)))",
        "delim512": "p = split(string!(.message), \"|\", limit: 6)\n"
                    + "\n".join(f".{k} = p[{i}]" for i, k in enumerate(DELIM_KEYS)),
    }

    def command(self, workdir, inputs, output, parse=None):
        data = os.path.join(workdir, "data")
        os.makedirs(data, exist_ok=True)
        cfg = {"data_dir": data, "sources": {}, "transforms": {}, "sinks": {}}
        names = []
        for i, path in enumerate(inputs):
            src = {"type": "file", "include": [path], "read_from": "beginning",
                   "ignore_checkpoints": True}
            if parse == "multiline512":
                src["multiline"] = {"start_pattern": START, "condition_pattern": START,
                                    "mode": "halt_before", "timeout_ms": 1000}
            cfg["sources"][f"in{i}"] = src
            names.append(f"in{i}")
        if parse in self.REMAP:
            cfg["transforms"]["parse"] = {"type": "remap", "inputs": names,
                                          "source": self.REMAP[parse]}
            names = ["parse"]
        cfg["sinks"]["out"] = {"type": "file", "inputs": names, "path": output,
                               "encoding": {"codec": "json" if parse else "text"}}
        if not cfg["transforms"]:
            del cfg["transforms"]
        path = os.path.join(workdir, "vector.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        return [self.bin, "--config", path, "--quiet"]

    def env(self):
        return {"VECTOR_LOG": "warn"}


class Otelcol(Agent):
    """The OpenTelemetry Collector (scripts/peers/otelcol.sh's build): filelog
    receiver (start_at beginning) with its operators → file exporter."""
    name, label = "otelcol", "OTel Collector"
    marker = b'"observedTimeUnixNano"'
    note = ("The Collector is an ocb build of the filelog receiver and the file exporter "
            "(scripts/peers/otelcol.sh); its file exporter writes OTLP JSON, not the raw line.")

    OPERATORS = {
        "regex512": [{"type": "regex_parser", "regex": REGEX512}],
        "json512": [{"type": "json_parser"}],
        "delim512": [{"type": "csv_parser", "header": "|".join(DELIM_KEYS), "delimiter": "|"}],
    }

    def command(self, workdir, inputs, output, parse=None):
        receivers = {}
        for i, path in enumerate(inputs):
            r = {"include": [path], "start_at": "beginning"}
            if parse == "multiline512":
                r["multiline"] = {"line_start_pattern": START}
            elif parse:
                r["operators"] = self.OPERATORS[parse]
            receivers["filelog" if len(inputs) == 1 else f"filelog/{i}"] = r
        cfg = {
            "receivers": receivers,
            "exporters": {"file": {"path": output, "flush_interval": "200ms"}},
            "service": {
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                "pipelines": {"logs": {"receivers": list(receivers), "exporters": ["file"]}},
            },
        }
        path = os.path.join(workdir, "otelcol.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        # The Collector reads YAML; JSON is YAML.
        return [self.bin, "--config", f"file:{path}"]


AGENTS = {a.name: a for a in (Petrel, FluentBit, Otelcol, Vector)}


def make(name, binary):
    return AGENTS[name](binary)
