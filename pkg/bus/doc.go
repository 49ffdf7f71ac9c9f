// Package bus is Hermes on NATS JetStream: connecting, provisioning the record stream, its
// consumers and KV buckets, publishing HermesMessages with deterministic Nats-Msg-Ids, reading
// and recording a request's state (its plan in KV; its results and response once each, on the
// record itself, each on a subject of its own written with an expected last sequence), and consuming
// messages with bounded concurrency and one ack policy. It also embeds a NATS server.
//
// Layout (see Provision): the stream HERMES records every message of every session under the
// subjects of protocol.StreamSubjects. Work is handed out by durable pull consumers on that
// stream: "router-requests-<partition>" (one request in flight each), "router-results", and one
// "tool_<kind>-<tool>" per action kind and tool (hermes.tool_<kind>.<tool>.*), each shared by
// every instance of its worker. Consumers deliver only messages published after they were
// created (DeliverNew), never expire, and are created before the first message they must see:
// Provision creates the router's, and EnsureToolConsumer is called before a tool's first call of
// a kind is published. So no consumer replays history because it was created late, and calls
// published before any worker ran are executed once one starts. The stream HERMES_DLQ keeps dead
// letters and the advisories naming them; HERMES_TIMERS holds the timers of parked messages.
//
// Guarantees of Subscriber: a message is acked only after its handler returned nil; an error
// naks it with a delay (redelivery, possibly to another instance), a Permanent error terminates
// it, and a panic is recovered and naks. Handlers never ack themselves: Subscriber.handle is the
// one place that decides. Middleware (Decode, Log, Trace, Recover; Messages stacks them) gives
// a handler the decoded envelope, a logger naming the message and a span, so a consumer is
// only its business logic. Delivery is at-least-once: handlers must be idempotent.
package bus
