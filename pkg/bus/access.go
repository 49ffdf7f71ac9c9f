package bus

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Role is what a NATS user of a Hermes deployment is for. Each role's permissions (Access)
// allow the subjects and JetStream API calls its service needs, and nothing else: only the
// gateway and external clients publish requests, only routers dispatch calls and create tool
// consumers, only workers (and routers, for calls they cannot dispatch) record results, and
// only admin creates, changes or deletes streams, buckets and fixed consumers.
type Role string

// The roles of a Hermes deployment.
const (
	// RoleAdmin may do anything: hermes provision, hermes keys, hermes dlq retry and the
	// other command-line tools run as admin.
	RoleAdmin Role = "admin"
	// RoleGateway is the HTTP gateway: it records plans and owners, publishes requests and
	// cancellations, reads the record and receives responses.
	RoleGateway Role = "gateway"
	// RoleRouter is a router, and the dead-letter processor beside it (hermes dead-letters
	// runs as a router too): it consumes requests, results and dead-letter advisories,
	// dispatches tool calls, creates tools' consumers and records responses.
	RoleRouter Role = "router"
	// RoleWorker is a tool worker: it consumes tool calls, claims them, and records their
	// results and tool_started events.
	RoleWorker Role = "toolworker"
	// RoleClient is an external NATS client: it may publish requests, on
	// protocol.SubjectClientRequest under its own name, and nothing else (not read the record,
	// not receive responses). The NATS user is its identity: a gateway submits its requests as
	// the caller nats:<user>.
	RoleClient Role = "client"
	// RoleEraser is the eraser (hermes eraser): it follows the erasures owners ask for through
	// a gateway (DELETE /v1/memory) and purges what they name from the record — the one
	// service that may purge it, and all it may do besides is read the record's sessions and
	// the buckets it is given (the erasures'). It publishes no message.
	RoleEraser Role = "eraser"
	// RoleAuditor is the audit service (hermes audit): it projects the record into PostgreSQL
	// through a durable consumer of its own on each record stream (ConsumerAudit), which it
	// creates, takes from and acks; all it may do besides is read the streams' and consumers'
	// information. It publishes no message, reads no bucket, gets no message of the record
	// but those its consumers deliver, and cannot touch any other consumer.
	RoleAuditor Role = "auditor"
)

// Roles lists every role, in the order the permission table shows them.
var Roles = []Role{RoleAdmin, RoleGateway, RoleRouter, RoleWorker, RoleClient, RoleEraser, RoleAuditor}

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("no NATS role %q (roles: %s)", s, joinRoles())
}

func joinRoles() string {
	var s []string
	for _, r := range Roles {
		s = append(s, string(r))
	}
	return strings.Join(s, ", ")
}

// Access is what one role may publish and subscribe to. Deny wins over Allow.
type Access struct {
	Publish, Subscribe   []string
	DenyPublish, DenySub []string
	// Inbox is the reply-subject prefix the role's connections must use (nats.CustomInboxPrefix),
	// the only one they may subscribe under: each service role has its own (RoleInbox), and so
	// has each external client (ClientInbox), so that no user receives the replies meant for
	// another's connections (a gateway's key lookups, a router's claims). Admin's is _INBOX, and
	// it may subscribe to anything.
	Inbox string
	// Responses lets the role answer what it is asked (allow_responses): one reply to the
	// reply subject of each request it receives, within ResponseWithin, and to no other
	// subject of anyone's inbox. Routers answer the gateways' fast-lane requests so.
	Responses bool
}

// ResponseWithin is how long a role with Responses may answer a request it received.
const ResponseWithin = time.Minute

// InboxOf is the inbox prefix of what is named name: _INBOX_<name>. A name must be a token
// (protocol.CheckID), so that no inbox is another's prefix.
func InboxOf(name string) string { return "_INBOX_" + name }

// RoleInbox is the inbox prefix of the users of service role: _INBOX_<role> (_INBOX_gateway,
// _INBOX_router, _INBOX_toolworker). Every service that knows its role connects with it.
func RoleInbox(role Role) string { return InboxOf(string(role)) }

// ClientInbox is the inbox prefix of the external client user named user.
func ClientInbox(user string) string { return InboxOf(user) }

// JetStream API subjects.
const (
	jsAPI = "$JS.API."
	jsAck = "$JS.ACK."
)

// reads are the JetStream calls that only read: stream and consumer information, and gets of
// any message of any stream.
func reads() []string {
	return append(metadata(), jsAPI+"STREAM.MSG.GET.*", jsAPI+"DIRECT.GET.>")
}

// metadata are the JetStream calls that read no message: stream and consumer information.
func metadata() []string {
	return []string{
		jsAPI + "INFO",
		jsAPI + "STREAM.INFO.*",
		jsAPI + "STREAM.NAMES",
		jsAPI + "STREAM.LIST",
		jsAPI + "CONSUMER.INFO.*.*",
		jsAPI + "CONSUMER.NAMES.*",
		jsAPI + "CONSUMER.LIST.*",
	}
}

// bucketReads lets a role read keys of the buckets named (a get reads from the leader, or a
// direct get from any replica), and no other bucket.
func bucketReads(buckets ...string) []string {
	var out []string
	for _, b := range buckets {
		out = append(out, jsAPI+"STREAM.MSG.GET."+KVStream(b), jsAPI+"DIRECT.GET."+KVStream(b), jsAPI+"DIRECT.GET."+KVStream(b)+".>")
	}
	return out
}

// recordStreams are the names of every stream a record may have (protocol.RecordStream):
// permissions name them all, so that a record provisioned, or given more streams, with any
// number keeps the permissions given.
func recordStreams() []string {
	out := make([]string, protocol.MaxRecordStreams)
	for k := range out {
		out[k] = protocol.RecordStream(k)
	}
	return out
}

// onRecord returns what f makes of each stream a record may have, in order.
func onRecord(f func(k int) []string) []string {
	var out []string
	for k := range protocol.MaxRecordStreams {
		out = append(out, f(k)...)
	}
	return out
}

// recordEvents are the subjects of events of kinds in every stream a record may have.
func recordEvents(kinds ...string) []string {
	return onRecord(func(k int) []string {
		var out []string
		for _, kind := range kinds {
			out = append(out, protocol.FilterEventsIn(k, kind))
		}
		return out
	})
}

// ordered lets a role read streams through consumers of its own (ordered consumers, bucket
// watches), which it creates, pulls from and deletes. The record's are created under a name
// in the API subject, never by the form that takes the name from the request body (which would
// get past the deny of the routers' consumers).
func ordered(streams ...string) []string {
	var out []string
	for _, s := range streams {
		out = append(out, jsAPI+"CONSUMER.CREATE."+s+".>", jsAPI+"CONSUMER.MSG.NEXT."+s+".*", jsAPI+"CONSUMER.DELETE."+s+".*")
		if _, record := protocol.RecordStreamIndex(s); !record {
			out = append(out, jsAPI+"CONSUMER.CREATE."+s)
		}
	}
	// Flow control of push consumers (bucket watches) is answered on $JS.FC.
	return append(out, "$JS.FC.>")
}

// consume lets a role fetch from and ack the durable consumers named, of stream ("*": of
// whichever stream has them — the record's consumers have the same names in each of its
// streams, and only its streams have them).
func consume(stream string, consumers ...string) []string {
	var out []string
	for _, c := range consumers {
		out = append(out, jsAPI+"CONSUMER.MSG.NEXT."+stream+"."+c, jsAck+stream+"."+c+".>")
	}
	return out
}

// writes lets a role put, update and delete keys of the buckets named.
func writes(buckets ...string) []string {
	var out []string
	for _, b := range buckets {
		out = append(out, "$KV."+b+".>")
	}
	return out
}

// Record subjects, by what is written there, in every stream a record may have.
func subjRequests() []string {
	return onRecord(func(k int) []string { return []string{protocol.RecordRoot(k) + ".request.*"} })
}

func subjFastRecorded() []string {
	return onRecord(func(k int) []string { return []string{protocol.RecordRoot(k) + ".request.fast.*"} })
}

func subjResults() []string {
	return onRecord(func(k int) []string { return []string{protocol.FilterResultsIn(k)} })
}

func subjResponses() []string {
	return onRecord(func(k int) []string { return []string{protocol.RecordRoot(k) + ".response.*.*"} })
}

var (
	// subjMicro is where NATS micro services are discovered (PING, INFO, STATS).
	subjMicro = "$SRV.>"
	// subjAdminInbox is where the admin (and the nats CLI run as it) takes its replies: a
	// service answers discovery there. No service subscribes under it (each has an inbox of
	// its own), so none reads what another answers.
	subjAdminInbox = "_INBOX.>"
	// subjServiceReplies are the reply subjects the server gives, in Hermes' account, to the
	// calls clients make through the import of their subjects.
	subjServiceReplies = "_R_.>"
	// subjWorkerEndpoints are the tool workers' micro endpoints (internal/discovery).
	subjWorkerEndpoints = "hermes.svc.toolworker.>"
	subjLive            = "hermes.live.>"
	subjTimers          = "hermes.timer.at.>"
	subjDLQ             = protocol.FilterDeadLetters
)

func subjToolCalls() []string {
	return onRecord(func(s int) []string {
		var out []string
		for _, k := range protocol.Kinds {
			out = append(out, protocol.FilterToolCallsIn(s, k, "*"))
		}
		return out
	})
}

// toolConsumers lets a role create consumers of tool calls, and only of them: the first router
// to dispatch a tool a call creates its consumers, or a worker serving the tool started before
// (the consumer's filter is part of the API subject; each record stream has its own).
func toolConsumers() []string {
	return onRecord(func(s int) []string {
		var out []string
		for _, k := range protocol.Kinds {
			out = append(out, jsAPI+"CONSUMER.CREATE."+protocol.RecordStream(s)+".*."+protocol.FilterToolCallsIn(s, k, "*"))
		}
		return out
	})
}

// parking lets a role park messages and wake them (package park): an entry is removed by a
// purge of its key below a revision (a bucket's messages cannot be deleted one by one), a timer
// likewise. The purge API takes its filter in the request, so a role that parks could purge the
// whole lot: the gateway and routers only.
func parking() []string {
	return []string{jsAPI + "STREAM.PURGE." + KVStream(BucketParked), jsAPI + "STREAM.PURGE." + protocol.TimerStreamName}
}

// fixedConsumers are the API subjects that would create, change, delete, take from or ack the
// routers' consumers and the audit's: denied to roles that read the record through consumers of
// their own.
func fixedConsumers() []string {
	var out []string
	for _, c := range append(requestConsumers(), ConsumerRouterResults, ConsumerAudit) {
		out = append(out, denyConsumer(c)...)
	}
	return out
}

// denyConsumer is what taking from, acking on, creating or deleting consumer name of any
// stream (the record's streams have it) publishes.
func denyConsumer(name string) []string {
	var out []string
	for _, api := range []string{"CONSUMER.CREATE.", "CONSUMER.DELETE.", "CONSUMER.MSG.NEXT."} {
		out = append(out, jsAPI+api+"*."+name)
	}
	return append(out, jsAPI+"CONSUMER.CREATE.*."+name+".>", jsAck+"*."+name+".>")
}

// requestConsumers are the consumers of every request partition a record may have: a record
// provisioned, or repartitioned, with any number keeps the permissions given.
func requestConsumers() []string {
	var out []string
	for p := range protocol.MaxRequestPartitions {
		out = append(out, RequestConsumer(p))
	}
	return out
}

// AccessOf returns the permissions of role; user names the NATS user (the client role's inbox
// is its own). A service role's users may subscribe under their role's inbox only (RoleInbox),
// never another role's or _INBOX. The application's buckets add what they let role do
// (Bucket.Watchers, Bucket.Writers).
func AccessOf(role Role, user string, buckets ...Bucket) (Access, error) {
	if err := checkBuckets(buckets); err != nil {
		return Access{}, err
	}
	var a Access
	a.Inbox = RoleInbox(role)
	a.Subscribe = []string{a.Inbox + ".>"}
	switch role {
	case RoleAdmin:
		a.Inbox = "_INBOX"
		a.Publish, a.Subscribe = []string{">"}, []string{">"}
		return a, nil
	case RoleGateway:
		a.Publish = slices.Concat(reads(),
			consume(protocol.ClientStreamName, ConsumerClients),
			consume("*", ConsumerSummarizer),
			ordered(append(recordStreams(), KVStream(BucketTools), KVStream(BucketCalls), KVStream(BucketContracts))...),
			subjRequests(), recordEvents(protocol.EventCancel, protocol.EventLLM, protocol.EventSummary, protocol.EventPolicy, protocol.EventBlueprint, protocol.EventMemory),
			subjResults(), subjResponses(),
			[]string{subjLive, subjTimers,
				// the dead letters of external clients' requests it cannot submit, and no other
				protocol.SubjectDeadLetter(ConsumerClients),
				// what it asks the routers on the fast lane
				protocol.FilterFastRequests},
			writes(BucketCalls, BucketSessions, BucketParked, BucketClaims, BucketContracts),
			parking())
		// It serves the micro service hermes to external clients, and says so to discovery.
		a.Subscribe = append(a.Subscribe, protocol.FilterLiveResponses, protocol.FilterClientServices, subjMicro)
		// Its answers: to clients' calls (the server names their reply subjects _R_.… here)
		// and to discovery.
		a.Publish = append(a.Publish, subjServiceReplies, subjAdminInbox, protocol.FilterClientOut)
		a.DenyPublish = fixedConsumers()
	case RoleRouter:
		a.Publish = slices.Concat(reads(),
			ordered(KVStream(BucketTools), KVStream(BucketCalls), KVStream(BucketContracts)),
			consume("*", append(requestConsumers(), ConsumerRouterResults)...),
			consume(protocol.DLQStreamName, ConsumerDeadLetters),
			consume(protocol.TimerStreamName, ConsumerTimers),
			toolConsumers(),
			subjToolCalls(),
			subjRequests(), subjResults(), subjResponses(), subjFastRecorded(),
			// the starts of the fast lane's tries, written with its record
			recordEvents(protocol.EventPolicy, protocol.EventCoordination, protocol.EventFastCall, protocol.EventToolStarted),
			[]string{subjLive, subjTimers, subjDLQ, protocol.FilterFastCalls},
			writes(BucketCalls, BucketTools, BucketClaims, BucketSessions, BucketParked),
			parking())
		// It shows itself to NATS micro discovery (hermes-router), and answers the gateways'
		// fast-lane requests.
		a.Subscribe = append(a.Subscribe, subjMicro, protocol.FilterFastRequests, protocol.FastReplies+".>")
		a.Responses = true
		a.Publish = append(a.Publish, subjAdminInbox)
		// It creates tools' consumers under any name: never the audit's, which the audit
		// would then keep as it is, reading tool calls only.
		a.DenyPublish = denyConsumer(ConsumerAudit)
	case RoleWorker:
		// A worker reads the buckets its ledger, routes and contracts need, and no message of
		// the record but the calls its consumers deliver: the ledger says which calls are
		// finished, and it records results without reading (Bus.PublishResult). Never a get
		// of the record, nor the plans', keys', owners', sign-ins' or sessions' buckets.
		a.Publish = slices.Concat(metadata(),
			bucketReads(BucketClaims, BucketTools, BucketContracts),
			ordered(KVStream(BucketTools), KVStream(BucketContracts)),
			onRecord(func(k int) []string {
				return []string{jsAPI + "CONSUMER.MSG.NEXT." + protocol.RecordStream(k) + ".*", jsAck + protocol.RecordStream(k) + ".*.>"}
			}),
			toolConsumers(),
			recordEvents(protocol.EventToolStarted), subjResults(),
			writes(BucketClaims, BucketTools))
		// It shows itself and its tools to NATS micro discovery (hermes-toolworker; the tools'
		// endpoints answer their figures).
		a.Subscribe = slices.Concat(a.Subscribe, recordEvents(protocol.EventCancel), []string{subjMicro, subjWorkerEndpoints, protocol.FilterFastCalls})
		// Its answers to the fast lane's calls go where routers take them, and nowhere else:
		// not allow_responses, which would let it answer into the gateway's inbox the
		// cancellations it receives name.
		a.Publish = append(a.Publish, protocol.FastReplies+".>")
		a.Publish = append(a.Publish, subjAdminInbox)
		// A worker takes calls from tools' consumers only, never a router's or the
		// summarizer's.
		a.DenyPublish = append(fixedConsumers(), denyConsumer(ConsumerSummarizer)...)
	case RoleEraser:
		// It finds an owner's sessions through a consumer of its own (never a router's), asks
		// the stream how many messages each holds, and purges them: the purge API takes its
		// filter in the request, so whoever may purge may purge anything of the record.
		a.Publish = slices.Concat(metadata(), ordered(recordStreams()...), onRecord(func(k int) []string {
			return []string{jsAPI + "STREAM.PURGE." + protocol.RecordStream(k)}
		}))
		a.DenyPublish = append(fixedConsumers(), denyConsumer(ConsumerSummarizer)...)
	case RoleAuditor:
		// It reads everything of each record stream through its own consumer, made with the
		// stream's every subject as its filter (AuditConsumer), under that name alone.
		a.Publish = slices.Concat(metadata(), onRecord(func(k int) []string {
			return []string{jsAPI + "CONSUMER.CREATE." + protocol.RecordStream(k) + "." + ConsumerAudit + ".>"}
		}), consume("*", ConsumerAudit))
	case RoleClient:
		if err := protocol.CheckID("NATS user", user); err != nil {
			return Access{}, err
		}
		a.Inbox = ClientInbox(user)
		a.Publish = []string{protocol.SubjectClientRequest(user, "*"), protocol.SubjectClientService(user, "*")}
		a.Subscribe = []string{a.Inbox + ".>", protocol.FilterClientOutOf(user)}
	default:
		return Access{}, fmt.Errorf("no NATS role %q (roles: %s)", role, joinRoles())
	}
	grant(&a, role, buckets)
	return a, nil
}

// WorkerAccessFor returns the permissions of a tool worker user named user that serves tools
// only: a tool worker's (AccessOf(RoleWorker, …)) with its rights over every tool narrowed to
// tools. It may create only those tools' consumers (of every action kind, each under its own
// name and filter: ToolConsumer, protocol.FilterToolCalls), take from and ack only them, and
// write in the tools' bucket only their keys (protocol.KeyTool) and the MCP servers' states
// (protocol.KeyMCPState, which name no tool); everything else is a tool worker's. Its inbox is
// its own, InboxOf(user). user must be an id and no role's name; tools must be tool names
// (subject tokens: protocol.CheckToolName), at least one.
func WorkerAccessFor(user string, tools []string, buckets ...Bucket) (Access, error) {
	if err := protocol.CheckID("NATS user", user); err != nil {
		return Access{}, err
	}
	if _, err := ParseRole(user); err == nil {
		return Access{}, fmt.Errorf("NATS user %s: a worker user may not have a role's name (it would share that role's inbox)", user)
	}
	if len(tools) == 0 {
		return Access{}, fmt.Errorf("NATS user %s: a worker user serves at least one tool (the %s role serves every tool)", user, RoleWorker)
	}
	seen := map[string]bool{}
	var next, ack, create, keys, fast []string
	for _, t := range tools {
		if err := protocol.CheckToolName("tool", t); err != nil {
			return Access{}, fmt.Errorf("NATS user %s: %w", user, err)
		}
		if seen[t] {
			return Access{}, fmt.Errorf("NATS user %s: tool %s named twice", user, t)
		}
		seen[t] = true
		fast = append(fast, protocol.FilterFastCallsOf(t))
		for _, k := range protocol.Kinds {
			c := ToolConsumer(k, t)
			for s, stream := range recordStreams() {
				next = append(next, jsAPI+"CONSUMER.MSG.NEXT."+stream+"."+c)
				ack = append(ack, jsAck+stream+"."+c+".>")
				create = append(create, jsAPI+"CONSUMER.CREATE."+stream+"."+c+"."+protocol.FilterToolCallsIn(s, k, t))
			}
			keys = append(keys, KVSubject(BucketTools, protocol.KeyTool(k, t)))
		}
	}
	keys = append(keys, KVSubject(BucketTools, protocol.MCPStatePrefix+">"))
	a, err := AccessOf(RoleWorker, user, buckets...)
	if err != nil {
		return Access{}, err
	}
	// Each right over every tool gives way to the same right over these tools.
	narrowed := map[string]*[]string{}
	for _, stream := range recordStreams() {
		narrowed[jsAPI+"CONSUMER.MSG.NEXT."+stream+".*"] = &next
		narrowed[jsAck+stream+".*.>"] = &ack
	}
	for _, w := range toolConsumers() {
		narrowed[w] = &create
	}
	for _, w := range writes(BucketTools) {
		narrowed[w] = &keys
	}
	done := map[*[]string]bool{}
	var publish []string
	for _, s := range a.Publish {
		n, ok := narrowed[s]
		if !ok {
			publish = append(publish, s)
			continue
		}
		if !done[n] {
			publish = append(publish, *n...)
			done[n] = true
		}
	}
	if len(done) != 4 {
		return Access{}, fmt.Errorf("bus: a tool worker's permissions no longer hold the rights WorkerAccessFor narrows (%d of 4 found)", len(done))
	}
	a.Publish = publish
	a.Inbox = InboxOf(user)
	shared := RoleInbox(RoleWorker) + ".>"
	a.Subscribe = append([]string{a.Inbox + ".>"}, slices.DeleteFunc(a.Subscribe, func(s string) bool { return s == shared || s == protocol.FilterFastCalls })...)
	a.Subscribe = append(a.Subscribe, fast...)
	return a, nil
}

// ServerPermissions is a in the embedded server's form.
func (a Access) ServerPermissions() *server.Permissions {
	p := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: a.Publish, Deny: a.DenyPublish},
		Subscribe: &server.SubjectPermission{Allow: a.Subscribe, Deny: a.DenySub},
	}
	if a.Responses {
		p.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: ResponseWithin}
	}
	return p
}

// Conf renders a as the permissions block of a nats-server configuration file.
func (a Access) Conf(indent string) string {
	var b strings.Builder
	list := func(name string, subjects []string) {
		if len(subjects) == 0 {
			return
		}
		b.WriteString(indent + "  " + name + ": [")
		for i, s := range subjects {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(s))
		}
		b.WriteString("]\n")
	}
	b.WriteString(indent + "permissions: {\n")
	b.WriteString(indent + "  publish: {\n")
	list("  allow", a.Publish)
	list("  deny", a.DenyPublish)
	b.WriteString(indent + "  }\n")
	b.WriteString(indent + "  subscribe: {\n")
	list("  allow", a.Subscribe)
	list("  deny", a.DenySub)
	b.WriteString(indent + "  }\n")
	if a.Responses {
		b.WriteString(indent + "  allow_responses: {max: 1, expires: \"" + ResponseWithin.String() + "\"}\n")
	}
	b.WriteString(indent + "}\n")
	return b.String()
}
