// Pinned versions of the servers the tests and the demo run.
// Installed into .tools/bin by `make tools` (see tools/install-servers.sh).
module liftbridge-provider/tools

go 1.26

require (
	github.com/liftbridge-io/liftbridge v1.9.0
	github.com/nats-io/nats-server/v2 v2.7.4
)
