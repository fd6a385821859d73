module petrel.test/opampserver

go 1.24.0

require (
	github.com/open-telemetry/opamp-go v0.23.0
	google.golang.org/protobuf v1.36.11
)

require github.com/gorilla/websocket v1.5.3 // indirect
