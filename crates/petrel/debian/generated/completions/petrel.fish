# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_petrel_global_optspecs
    string join \n h/help V/version
end

function __fish_petrel_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_petrel_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_petrel_using_subcommand
    set -l cmd (__fish_petrel_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c petrel -n "__fish_petrel_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c petrel -n "__fish_petrel_needs_command" -s V -l version -d 'Print version'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "run" -d 'Run pipelines until SIGINT or SIGTERM'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "validate" -d 'Check pipeline files; exit 2 with one `FILE:LINE:COL: problem` line each'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "test" -d 'Run pipeline unit tests (`*.test.yaml`): feed lines to a pipeline\'s processor chain in-process and check the events at a component; exit 0 when all pass, 1 when one fails, 2 on invalid config or test files'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "convert" -d 'Convert another agent\'s configuration into Petrel pipeline files, with a report of what was converted, approximated or not converted; exit 1 when something was not converted (unless `--bypass-errors`), 2 when the input cannot be read'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "gen" -d 'Write a benchmark data set'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "pipe" -d 'Copy standard input to a spool directory without ever making the writer wait (for Apache `CustomLog "|petrel pipe ..."`); a running agent reads it with `sources: [{type: spool, path: DIR}]`'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "tap" -d 'Print a sample of the events leaving a component of a running agent (ndjson or their messages); the pipeline never waits for it'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "docs" -d 'Print generated documentation: the component reference (Markdown), shell completions or the man page'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "top" -d 'A live terminal view of a running agent (rates per component, lag per file, memory, CPU), read from its API; `q` quits'
complete -c petrel -n "__fish_petrel_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c petrel -n "__fish_petrel_using_subcommand run" -l config -d 'A pipeline file or a directory of `*.yaml`/`*.yml` files (one pipeline each, named by file stem)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l data-dir -d 'Where checkpoints are kept' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l threads -d 'Processing threads (default: number of cores)' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l memory-limit -d 'Memory for in-flight data, e.g. 16777216 or 16MiB (the default, chosen by measurement: see BENCHMARKS.md)' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-addr -d 'Address of the metrics and health API; port 0 picks a free port' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-tls-cert -d 'Serve the API over TLS with this PEM certificate chain (with --api-tls-key); read again when the file changes' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-tls-key -d 'The PEM private key of --api-tls-cert' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-tls-client-ca -d 'With --api-tls-cert: clients must present a certificate signed by this PEM CA (mutual TLS)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-auth -d 'Which endpoints need the bearer token (PETREL_API_TOKEN or --api-token-file): `control` (/reload and /tap), `metrics` (also /metrics and /health; the probes /health/live and /health/ready stay open for the kubelet) or `all` (the probes too)' -r -f -a "control\t'`/reload` and `/tap` (control and log contents)'
metrics\t'Also `/metrics` and `/health`; the probes stay open'
all\t'Every endpoint, the probes `/health/live` and `/health/ready` too'"
complete -c petrel -n "__fish_petrel_using_subcommand run" -l api-token-file -d 'A file holding the API\'s bearer token (instead of PETREL_API_TOKEN; a final newline is ignored)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l log-level -d 'Log level (error, warn, info, debug, trace) or a tracing filter; overrides PETREL_LOG' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l log-format -d 'Format of the agent\'s own log lines on stderr: `text` for people, `json` (one object per line) for log pipelines such as Kubernetes\'' -r -f -a "text\t'One human-readable line per record'
json\t'One JSON object per line: `timestamp`, `level`, `message` and the record\'s fields at the top level'"
complete -c petrel -n "__fish_petrel_using_subcommand run" -l shutdown-timeout -d 'Longest wait, in seconds, for in-flight data at shutdown (and for draining a pipeline changed by a reload)' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l checkpoint-ttl -d 'How long offsets of files that are not seen (a directory not mounted yet, a pipeline removed) are kept, e.g. 7d, 12h, 3600s' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l unhealthy-after -d 'How long a sink may keep failing before `/health` reports it (seconds); problems such as a dead thread count at once' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l agent-config -d 'The agent file: fleet management over OpAMP (`opamp:`), how remote pipelines are applied (`remote:`) and what they may do (`limits:`)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand run" -l opamp-endpoint -d 'The OpAMP server to be managed by (`ws://`, `wss://`, `http://`, `https://`), with the agent file\'s other settings or their defaults; overrides the agent file\'s `opamp.endpoint`' -r
complete -c petrel -n "__fish_petrel_using_subcommand run" -l no-watch-config -d 'Do not watch `--config` for changes (reload with SIGHUP or `POST /reload` only)'
complete -c petrel -n "__fish_petrel_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c petrel -n "__fish_petrel_using_subcommand validate" -l config -d 'A pipeline file or a directory of `*.yaml`/`*.yml` files' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand validate" -l offline -d 'Check the configuration alone, away from the host it runs on: skip what needs that host (that TLS certificates, keys and `remap` program files exist and load, what a sink\'s path is)'
complete -c petrel -n "__fish_petrel_using_subcommand validate" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand test" -l config -d 'A pipeline file or a directory of `*.yaml`/`*.yml` files' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand test" -l junit -d 'Write a JUnit XML report here' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand test" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l from -d 'The format of the input' -r -f -a "fluent-bit\t'Fluent Bit\'s classic `.conf` format (`[INPUT]` sections, `@INCLUDE`, `@SET`, parsers files)'"
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l import-positions -d 'Import the other agent\'s read positions from this file (Fluent Bit\'s tail `DB`) into the checkpoints of `--data-dir`, for the sources of the Petrel pipelines in `--config` (or `--out`). Run it with the agents stopped' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l data-dir -d 'Petrel\'s data directory (`petrel run --data-dir`)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l config -d 'The Petrel pipelines the positions are for (default: `--out`)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l out -d 'Write one `<pipeline>.yaml` per pipeline here (default: print them)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l report -d 'Write the report (Markdown) here (default: standard error)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand convert" -l bypass-errors -d 'Exit 0 even when parts were not converted'
complete -c petrel -n "__fish_petrel_using_subcommand convert" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l format -d 'Data set' -r -f -a "single128\t''
regex512\t''
json512\t''
delim512\t''
multiline512\t''
nginx283\t''"
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l size -d 'Total bytes, e.g. 1GiB' -r
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l rate -d 'Bytes per second, e.g. 10MB' -r
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l duration -d 'Seconds to write at `--rate`' -r
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l output -d 'Output file (appended to)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l rotate-bytes -d 'Rename the file to `<output>.N` each time it reaches this size' -r
complete -c petrel -n "__fish_petrel_using_subcommand gen" -l seed -d 'Seed of the random parts' -r
complete -c petrel -n "__fish_petrel_using_subcommand gen" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -l spool-dir -d 'The spool directory (created when missing)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -l name -d 'A name for this writer; events carry `source_address: pipe:NAME`' -r
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -l max-bytes -d 'Spool size cap; beyond it new lines are dropped and counted' -r
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -l sync-interval-ms -d 'Longest time written data waits for fsync, in milliseconds' -r
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -l max-line-bytes -d 'Lines longer than this are cut into pieces' -r
complete -c petrel -n "__fish_petrel_using_subcommand pipe" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l api-addr -d 'The agent\'s `--api-addr`; `https://host:port` for an API served over TLS' -r
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l api-ca-file -d 'PEM authority the agent\'s API certificate must chain to (beside Mozilla\'s roots), for an `https://` --api-addr' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l api-cert-file -d 'PEM client certificate for an API that asks for one (mutual TLS)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l api-key-file -d 'The PEM private key of --api-cert-file' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l limit -d 'Stop after this many events' -r
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l rate -d 'At most this many events per second' -r
complete -c petrel -n "__fish_petrel_using_subcommand tap" -l format -d '`ndjson` (every field) or `text` (the message)' -r -f -a "ndjson\t'One JSON object per event, every field (as the ndjson encoding)'
text\t'The `message` field only'"
complete -c petrel -n "__fish_petrel_using_subcommand tap" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and not __fish_seen_subcommand_from reference completions man help" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and not __fish_seen_subcommand_from reference completions man help" -f -a "reference" -d 'The component reference (Markdown): every source, processor and sink with its keys, their types, defaults and meaning'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and not __fish_seen_subcommand_from reference completions man help" -f -a "completions" -d 'A shell completion script on stdout'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and not __fish_seen_subcommand_from reference completions man help" -f -a "man" -d 'The man page (roff) on stdout'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and not __fish_seen_subcommand_from reference completions man help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from reference" -l out -d 'Write `sources.md`, `processors.md` and `sinks.md` into this directory instead of printing them one after the other' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from reference" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from completions" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from man" -l out -d 'Write `petrel.1` and a `petrel-SUBCOMMAND.1` for each subcommand into this directory instead' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from man" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from help" -f -a "reference" -d 'The component reference (Markdown): every source, processor and sink with its keys, their types, defaults and meaning'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from help" -f -a "completions" -d 'A shell completion script on stdout'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from help" -f -a "man" -d 'The man page (roff) on stdout'
complete -c petrel -n "__fish_petrel_using_subcommand docs; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c petrel -n "__fish_petrel_using_subcommand top" -l api-addr -d 'The agent\'s `--api-addr`; `https://host:port` for an API served over TLS' -r
complete -c petrel -n "__fish_petrel_using_subcommand top" -l api-ca-file -d 'PEM authority the agent\'s API certificate must chain to (beside Mozilla\'s roots), for an `https://` --api-addr' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand top" -l api-cert-file -d 'PEM client certificate for an API that asks for one (mutual TLS)' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand top" -l api-key-file -d 'The PEM private key of --api-cert-file' -r -F
complete -c petrel -n "__fish_petrel_using_subcommand top" -l interval-ms -d 'Milliseconds between two readings' -r
complete -c petrel -n "__fish_petrel_using_subcommand top" -s h -l help -d 'Print help'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "run" -d 'Run pipelines until SIGINT or SIGTERM'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "validate" -d 'Check pipeline files; exit 2 with one `FILE:LINE:COL: problem` line each'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "test" -d 'Run pipeline unit tests (`*.test.yaml`): feed lines to a pipeline\'s processor chain in-process and check the events at a component; exit 0 when all pass, 1 when one fails, 2 on invalid config or test files'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "convert" -d 'Convert another agent\'s configuration into Petrel pipeline files, with a report of what was converted, approximated or not converted; exit 1 when something was not converted (unless `--bypass-errors`), 2 when the input cannot be read'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "gen" -d 'Write a benchmark data set'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "pipe" -d 'Copy standard input to a spool directory without ever making the writer wait (for Apache `CustomLog "|petrel pipe ..."`); a running agent reads it with `sources: [{type: spool, path: DIR}]`'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "tap" -d 'Print a sample of the events leaving a component of a running agent (ndjson or their messages); the pipeline never waits for it'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "docs" -d 'Print generated documentation: the component reference (Markdown), shell completions or the man page'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "top" -d 'A live terminal view of a running agent (rates per component, lag per file, memory, CPU), read from its API; `q` quits'
complete -c petrel -n "__fish_petrel_using_subcommand help; and not __fish_seen_subcommand_from run validate test convert gen pipe tap docs top help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c petrel -n "__fish_petrel_using_subcommand help; and __fish_seen_subcommand_from docs" -f -a "reference" -d 'The component reference (Markdown): every source, processor and sink with its keys, their types, defaults and meaning'
complete -c petrel -n "__fish_petrel_using_subcommand help; and __fish_seen_subcommand_from docs" -f -a "completions" -d 'A shell completion script on stdout'
complete -c petrel -n "__fish_petrel_using_subcommand help; and __fish_seen_subcommand_from docs" -f -a "man" -d 'The man page (roff) on stdout'
