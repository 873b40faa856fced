module github.com/cyclone-workflows/cyclone/sdks/go

go 1.21

require (
	go.opentelemetry.io/otel v1.28.0
	go.opentelemetry.io/otel/sdk v1.28.0
	go.opentelemetry.io/otel/trace v1.28.0
	google.golang.org/grpc v1.64.1
	google.golang.org/protobuf v1.34.2
)
