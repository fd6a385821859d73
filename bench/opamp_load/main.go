// Command opampload simulates many agents against an OpAMP server, as
// clients of the protocol only (opamp-go's own WebSocket client, v0.23.0):
// each describes itself, reports health, and answers every remote
// configuration with APPLIED. bench/opamp_load.sh runs it against the test
// server to size a server for a fleet; it measures, this only loads.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-telemetry/opamp-go/client"
	"github.com/open-telemetry/opamp-go/client/types"
	"github.com/open-telemetry/opamp-go/protobufs"
)

type quiet struct{}

func (quiet) Debugf(context.Context, string, ...interface{}) {}
func (quiet) Errorf(context.Context, string, ...interface{}) {}

func kv(k, v string) *protobufs.KeyValue {
	return &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}
}

func main() {
	url := flag.String("url", "ws://127.0.0.1:4320/v1/opamp", "the server's OpAMP endpoint")
	agents := flag.Int("agents", 1000, "how many agents")
	ramp := flag.Duration("ramp", 10*time.Second, "start them over this long")
	duration := flag.Duration("duration", 60*time.Second, "then keep them connected this long (bounded: the tool stops by itself)")
	heartbeat := flag.Duration("heartbeat", 30*time.Second, "each agent's heartbeat")
	flag.Parse()

	var connected, applied atomic.Int64
	clients := make([]client.OpAMPClient, 0, *agents)
	var mu sync.Mutex
	ctx := context.Background()
	caps := protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus |
		protobufs.AgentCapabilities_AgentCapabilities_AcceptsRemoteConfig |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsRemoteConfig |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsHealth
	step := *ramp / time.Duration(max(*agents, 1))
	for i := 0; i < *agents; i++ {
		var uid types.InstanceUid
		if _, err := rand.Read(uid[:]); err != nil {
			log.Fatal(err)
		}
		c := client.NewWebSocket(quiet{})
		host := fmt.Sprintf("node-%05d", i)
		if err := c.SetAgentDescription(&protobufs.AgentDescription{
			IdentifyingAttributes:    []*protobufs.KeyValue{kv("service.name", "petrel"), kv("service.version", "load")},
			NonIdentifyingAttributes: []*protobufs.KeyValue{kv("host.name", host), kv("os.type", "linux")},
		}); err != nil {
			log.Fatal(err)
		}
		_ = c.SetHealth(&protobufs.ComponentHealth{Healthy: true, Status: "ok", StartTimeUnixNano: uint64(time.Now().UnixNano())})
		hb := *heartbeat
		cc := c
		err := c.Start(ctx, types.StartSettings{
			OpAMPServerURL:    *url,
			InstanceUid:       uid,
			Capabilities:      caps,
			HeartbeatInterval: &hb,
			Callbacks: types.Callbacks{
				OnConnect: func(context.Context) { connected.Add(1) },
				OnMessage: func(_ context.Context, m *types.MessageData) {
					if m.RemoteConfig != nil {
						_ = cc.SetRemoteConfigStatus(&protobufs.RemoteConfigStatus{
							LastRemoteConfigHash: m.RemoteConfig.ConfigHash,
							Status:               protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED,
						})
						applied.Add(1)
					}
				},
			},
		})
		if err != nil {
			log.Fatalf("agent %d: %v", i, err)
		}
		mu.Lock()
		clients = append(clients, c)
		mu.Unlock()
		time.Sleep(step)
	}
	fmt.Fprintf(os.Stderr, "started %d agents (%d connected)\n", *agents, connected.Load())
	time.Sleep(*duration)
	fmt.Printf("{\"agents\": %d, \"connected\": %d, \"configs_applied\": %d}\n", *agents, connected.Load(), applied.Load())
	for _, c := range clients {
		_ = c.Stop(ctx)
	}
}
