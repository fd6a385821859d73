// Command opamp-test-server is the OpAMP server of Petrel's fleet
// management tests: opamp-go's own server (v0.23.0, attached to a
// ServeMux of ours, so one port serves both transports: requests with
// Content-Type application/x-protobuf are plain HTTP, the rest are
// upgraded to WebSocket), with a control API on a second port through
// which a test sets the remote configuration, reads every AgentToServer
// received, and makes the server refuse, hang, block WebSocket or send
// bad input. The control port also receives OTLP/HTTP (/otlp/v1/logs,
// /otlp/v1/metrics), the destination it offers for the agent's own
// telemetry.
//
// It stops by itself after -lifetime, and every wait in it is bounded.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server"
	"github.com/open-telemetry/opamp-go/server/types"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type record struct {
	N         int             `json:"n"`
	Transport string          `json:"transport"`
	Msg       json.RawMessage `json:"msg"`
}

// otlpRecord is one OTLP/HTTP request received on /otlp/v1/logs or
// /otlp/v1/metrics (the agent's own telemetry).
type otlpRecord struct {
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"`
}

type agent struct {
	uid       []byte
	conn      types.Connection // WebSocket only
	reported  []byte           // last remote config hash the agent reported
	hasStatus bool
}

type state struct {
	mu      sync.Mutex
	files   map[string]*protobufs.AgentConfigFile
	hash    []byte
	hasCfg  bool
	records []record
	mode    string // normal, refuse, hang, block_ws
	retry   int    // Retry-After seconds for refuse
	agents  map[types.Connection]*agent
	pending []*protobufs.ServerToAgent // one-shot extras for HTTP agents
	keep    bool                       // record full messages (false: counts only, for load runs)
	count   int
	otlp    []otlpRecord // the last 500 OTLP requests
}

var st = &state{files: map[string]*protobufs.AgentConfigFile{}, mode: "normal", retry: 1, agents: map[types.Connection]*agent{}, keep: true}

const capabilities = uint64(protobufs.ServerCapabilities_ServerCapabilities_AcceptsStatus |
	protobufs.ServerCapabilities_ServerCapabilities_OffersRemoteConfig |
	protobufs.ServerCapabilities_ServerCapabilities_AcceptsEffectiveConfig)

func hashFiles(files map[string]*protobufs.AgentConfigFile) []byte {
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s:%d:", len(k), k, len(files[k].Body))
		h.Write(files[k].Body)
	}
	return h.Sum(nil)
}

func (s *state) remoteConfig() *protobufs.AgentRemoteConfig {
	return &protobufs.AgentRemoteConfig{Config: &protobufs.AgentConfigMap{ConfigMap: s.files}, ConfigHash: s.hash}
}

func onMessage(transport string) func(ctx context.Context, conn types.Connection, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
	return func(ctx context.Context, conn types.Connection, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
		st.mu.Lock()
		st.count++
		if st.keep {
			b, _ := protojson.Marshal(msg)
			st.records = append(st.records, record{N: len(st.records), Transport: transport, Msg: b})
		}
		a := st.agents[conn]
		if a == nil {
			a = &agent{}
			if transport == "websocket" {
				st.agents[conn] = a
				a.conn = conn
			}
		}
		a.uid = msg.InstanceUid
		if msg.RemoteConfigStatus != nil {
			a.reported = msg.RemoteConfigStatus.LastRemoteConfigHash
			a.hasStatus = true
		}
		mode := st.mode
		st.mu.Unlock()
		if mode == "hang" {
			// Bounded: a hung server answers after two minutes at most.
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				st.mu.Lock()
				m := st.mode
				st.mu.Unlock()
				if m != "hang" {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		resp := &protobufs.ServerToAgent{InstanceUid: msg.InstanceUid, Capabilities: capabilities}
		if transport == "http" && len(st.pending) > 0 {
			extra := st.pending[0]
			st.pending = st.pending[1:]
			proto.Merge(resp, extra)
			return resp
		}
		if st.hasCfg && (!a.hasStatus || string(a.reported) != string(st.hash)) {
			resp.RemoteConfig = st.remoteConfig()
		}
		return resp
	}
}

func wsAgents() []*agent {
	out := []*agent{}
	for _, a := range st.agents {
		if a.conn != nil {
			out = append(out, a)
		}
	}
	return out
}

// push sends msg to every WebSocket agent now and queues it for the next
// plain HTTP poll.
func push(msg *protobufs.ServerToAgent) int {
	st.mu.Lock()
	agents := wsAgents()
	st.pending = append(st.pending, msg)
	st.mu.Unlock()
	n := 0
	for _, a := range agents {
		m := proto.Clone(msg).(*protobufs.ServerToAgent)
		m.InstanceUid = a.uid
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := a.conn.Send(ctx, m); err == nil {
			n++
		} else {
			log.Printf("push: %v", err)
		}
		cancel()
	}
	return n
}

// rawFrame writes one unmasked WebSocket frame (server to client) with
// opcode op straight onto every WebSocket agent's connection.
func rawFrame(op byte, payload []byte) int {
	st.mu.Lock()
	agents := wsAgents()
	st.mu.Unlock()
	hdr := []byte{0x80 | op}
	switch {
	case len(payload) < 126:
		hdr = append(hdr, byte(len(payload)))
	case len(payload) < 65536:
		hdr = append(hdr, 126, byte(len(payload)>>8), byte(len(payload)))
	default:
		b := make([]byte, 8)
		binary.BigEndian.PutUint64(b, uint64(len(payload)))
		hdr = append(append(hdr, 127), b...)
	}
	n := 0
	for _, a := range agents {
		c := a.conn.Connection()
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(append(append([]byte{}, hdr...), payload...)); err == nil {
			n++
		}
		c.SetWriteDeadline(time.Time{})
	}
	return n
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func control(mux *http.ServeMux) {
	mux.HandleFunc("/control/config", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Files        map[string]string `json:"files"`
			ContentTypes map[string]string `json:"content_types"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		files := map[string]*protobufs.AgentConfigFile{}
		for k, v := range req.Files {
			ct := "text/yaml"
			if c, ok := req.ContentTypes[k]; ok {
				ct = c
			}
			files[k] = &protobufs.AgentConfigFile{Body: []byte(v), ContentType: ct}
		}
		st.mu.Lock()
		st.files = files
		st.hash = hashFiles(files)
		st.hasCfg = true
		rc := st.remoteConfig()
		h := fmt.Sprintf("%x", st.hash)
		st.pending = nil
		st.mu.Unlock()
		n := push(&protobufs.ServerToAgent{Capabilities: capabilities, RemoteConfig: rc})
		st.mu.Lock()
		st.pending = nil // HTTP agents get the standing config anyway
		st.mu.Unlock()
		writeJSON(w, map[string]any{"hash": h, "pushed": n})
	})
	mux.HandleFunc("/control/messages", func(w http.ResponseWriter, r *http.Request) {
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		st.mu.Lock()
		if from < 0 || from > len(st.records) {
			from = len(st.records)
		}
		out := append([]record{}, st.records[from:]...)
		n := len(st.records)
		count := st.count
		st.mu.Unlock()
		writeJSON(w, map[string]any{"messages": out, "next": n, "count": count})
	})
	mux.HandleFunc("/control/mode", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Mode  string `json:"mode"`
			Retry int    `json:"retry_after"`
			Keep  *bool  `json:"keep"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		st.mu.Lock()
		if req.Mode != "" {
			st.mode = req.Mode
		}
		if req.Retry > 0 {
			st.retry = req.Retry
		}
		if req.Keep != nil {
			st.keep = *req.Keep
		}
		st.mu.Unlock()
		writeJSON(w, map[string]any{"mode": req.Mode})
	})
	// An OTLP/HTTP receiver for the agent's own telemetry: records each
	// request (path, headers, protobuf body) and answers an empty success.
	otlp := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		h := map[string]string{}
		for k := range r.Header {
			h[k] = r.Header.Get(k)
		}
		st.mu.Lock()
		st.otlp = append(st.otlp, otlpRecord{Path: r.URL.Path, Headers: h, Body: body})
		if len(st.otlp) > 500 {
			st.otlp = st.otlp[len(st.otlp)-500:]
		}
		st.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(200)
	}
	mux.HandleFunc("/otlp/v1/logs", otlp)
	mux.HandleFunc("/otlp/v1/metrics", otlp)
	mux.HandleFunc("/control/otlp", func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		out := append([]otlpRecord{}, st.otlp...)
		st.mu.Unlock()
		writeJSON(w, map[string]any{"requests": out})
	})
	mux.HandleFunc("/control/agents", func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		n := len(wsAgents())
		st.mu.Unlock()
		writeJSON(w, map[string]any{"websocket": n})
	})
	// One-shot sends, not the standing configuration.
	mux.HandleFunc("/control/send", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Kind     string `json:"kind"`
			Bytes    int    `json:"bytes"`
			Count    int    `json:"count"`
			Template string `json:"template"`
			Logs     string `json:"logs"`
			Metrics  string `json:"metrics"`
			Header   string `json:"header"`
			Insecure bool   `json:"insecure"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		n := 0
		switch req.Kind {
		case "text":
			n = rawFrame(0x1, []byte("this is not OpAMP"))
		case "bad_header":
			n = rawFrame(0x2, []byte{0x07, 0x0a, 0x00})
		case "garbage":
			n = rawFrame(0x2, []byte{0x00, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x33})
		case "unknown_capability":
			n = push(&protobufs.ServerToAgent{Capabilities: capabilities | 1<<40, CustomCapabilities: &protobufs.CustomCapabilities{Capabilities: []string{"io.example.unknown"}}})
		case "unknown_command":
			n = push(&protobufs.ServerToAgent{Command: &protobufs.ServerToAgentCommand{Type: protobufs.CommandType(7)}})
		case "restart":
			n = push(&protobufs.ServerToAgent{Command: &protobufs.ServerToAgentCommand{Type: protobufs.CommandType_CommandType_Restart}})
		case "packages":
			n = push(&protobufs.ServerToAgent{PackagesAvailable: &protobufs.PackagesAvailable{Packages: map[string]*protobufs.PackageAvailable{"petrel": {Version: "9.9.9"}}, AllPackagesHash: []byte{1}}})
		case "big":
			body := []byte("# " + strings.Repeat("x", req.Bytes) + "\n")
			files := map[string]*protobufs.AgentConfigFile{"big.yaml": {Body: body, ContentType: "text/yaml"}}
			n = push(&protobufs.ServerToAgent{RemoteConfig: &protobufs.AgentRemoteConfig{Config: &protobufs.AgentConfigMap{ConfigMap: files}, ConfigHash: hashFiles(files)}})
		case "new_uid":
			uid := make([]byte, 16)
			copy(uid, []byte(req.Template))
			n = push(&protobufs.ServerToAgent{AgentIdentification: &protobufs.AgentIdentification{NewInstanceUid: uid}})
		case "telemetry":
			// ConnectionSettingsOffers with own_logs and own_metrics
			// destinations (an empty URL turns one off; "-" leaves it
			// unset, meaning unchanged).
			offer := &protobufs.ConnectionSettingsOffers{}
			h := sha256.New()
			settings := func(url string) *protobufs.TelemetryConnectionSettings {
				fmt.Fprintf(h, "%s|", url)
				if url == "-" {
					return nil
				}
				t := &protobufs.TelemetryConnectionSettings{DestinationEndpoint: url}
				if req.Header != "" {
					t.Headers = &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: req.Header}}}
				}
				if req.Insecure {
					t.Tls = &protobufs.TLSConnectionSettings{InsecureSkipVerify: true}
				}
				return t
			}
			offer.OwnLogs = settings(req.Logs)
			offer.OwnMetrics = settings(req.Metrics)
			fmt.Fprintf(h, "%s|%v", req.Header, req.Insecure)
			offer.Hash = h.Sum(nil)
			n = push(&protobufs.ServerToAgent{ConnectionSettings: offer})
		case "many":
			files := map[string]*protobufs.AgentConfigFile{}
			for i := 0; i < req.Count; i++ {
				files[fmt.Sprintf("p%05d.yaml", i)] = &protobufs.AgentConfigFile{Body: []byte(strings.ReplaceAll(req.Template, "{{N}}", strconv.Itoa(i))), ContentType: "text/yaml"}
			}
			n = push(&protobufs.ServerToAgent{RemoteConfig: &protobufs.AgentRemoteConfig{Config: &protobufs.AgentConfigMap{ConfigMap: files}, ConfigHash: hashFiles(files)}})
		default:
			http.Error(w, "unknown kind "+req.Kind, 400)
			return
		}
		writeJSON(w, map[string]any{"sent": n})
	})
}

func main() {
	addr := flag.String("addr", "127.0.0.1:4320", "OpAMP listen address")
	controlAddr := flag.String("control", "127.0.0.1:0", "control API listen address")
	cert := flag.String("tls-cert", "", "serve OpAMP over TLS with this certificate (PEM)")
	key := flag.String("tls-key", "", "its key (PEM)")
	token := flag.String("token", "", "require Authorization: Bearer <token>")
	lifetime := flag.Duration("lifetime", 30*time.Minute, "exit after this long")
	keep := flag.Bool("record", true, "record every AgentToServer (off for load runs: counted only)")
	flag.Parse()
	st.keep = *keep
	go func() {
		time.Sleep(*lifetime)
		log.Printf("lifetime %v over: exiting", *lifetime)
		os.Exit(0)
	}()

	srv := server.New(nil)
	handler, connContext, err := srv.Attach(server.Settings{Callbacks: types.Callbacks{
		OnConnecting: func(r *http.Request) types.ConnectionResponse {
			st.mu.Lock()
			mode, retry := st.mode, st.retry
			st.mu.Unlock()
			if *token != "" && r.Header.Get("Authorization") != "Bearer "+*token {
				return types.ConnectionResponse{Accept: false, HTTPStatusCode: 401}
			}
			plain := r.Header.Get("Content-Type") == "application/x-protobuf"
			if mode == "refuse" {
				return types.ConnectionResponse{Accept: false, HTTPStatusCode: 503, HTTPResponseHeader: map[string]string{"Retry-After": strconv.Itoa(retry)}}
			}
			if mode == "block_ws" && !plain {
				return types.ConnectionResponse{Accept: false, HTTPStatusCode: 403}
			}
			transport := "websocket"
			if plain {
				transport = "http"
			}
			return types.ConnectionResponse{Accept: true, ConnectionCallbacks: types.ConnectionCallbacks{
				OnMessage: onMessage(transport),
				OnConnectionClose: func(conn types.Connection) {
					st.mu.Lock()
					delete(st.agents, conn)
					st.mu.Unlock()
				},
			}}
		},
	}})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/opamp", handler)
	hs := &http.Server{Handler: mux, ConnContext: connContext, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	cmux := http.NewServeMux()
	control(cmux)
	cln, err := net.Listen("tcp", *controlAddr)
	if err != nil {
		log.Fatal(err)
	}
	// The test reads both ports from this line.
	fmt.Printf("listening opamp=%s control=%s\n", ln.Addr(), cln.Addr())
	os.Stdout.Sync()
	go func() { log.Fatal(http.Serve(cln, cmux)) }()
	if *cert != "" {
		log.Fatal(hs.ServeTLS(ln, *cert, *key))
	}
	log.Fatal(hs.Serve(ln))
}
