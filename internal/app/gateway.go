package app

import (
	"context"
	"net"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/ingress"
	"github.com/hermesbus/hermes/internal/mcpserver"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/internal/summarize"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// ChatConfig configures the agent loop's front doors (package chat) and the summarizer beside
// them.
type ChatConfig struct {
	chat.Config
	// SummarizeEvery, when positive, runs the summarizer (package summarize) in the gateway's
	// process: every so many messages of a session, the model compresses its conversation.
	// Whether or not it runs there, /v1/chat reads a session's latest summary and the
	// messages since.
	SummarizeEvery int
	// Memory, when set, gives the loop memory: memory_write, the fragments each prompt
	// carries, the filters, and intents with their decay.
	Memory *memory.Config
}

// GatewayService is a gateway and the services of its process beside it: the bus ingress for
// external NATS clients, the contracts followed, the chat doors' vectors asked for ahead, the
// summarizer.
type GatewayService struct {
	*gateway.Gateway
	// Beside are the services beside the gateway: the ingress in the front phase (it takes
	// new work), the rest in the back.
	Beside service.List
}

// requestReader reads requests and who may read them, for the micro service's endpoint
// response.
type requestReader struct {
	gateway.Submitter
	*admission.Admitter
}

// Services are the gateway serving HTTP on ln, in the front phase, and the services beside it.
func (g *GatewayService) Services(ln net.Listener) *service.List {
	var l service.List
	l.Add(service.Front, service.Func("gateway", func(ctx context.Context) error { return g.Gateway.Run(ctx, ln) }))
	l.Append(&g.Beside)
	return &l
}

// Run serves HTTP on ln and runs the services beside the gateway until ctx ends: the gateway
// and the ingress stop taking requests first and let those in flight finish, then the rest
// stop.
func (g *GatewayService) Run(ctx context.Context, ln net.Listener) error {
	return g.Services(ln).Run(ctx)
}

// NewGateway builds a gateway on nc and b with its doors and the services beside it: the bus
// ingress for external NATS clients and the micro service hermes they call; with the contracts' and sessions' buckets, the contracts
// followed (one registry.Live, the only cache of them in the process) and the MCP server (the
// blueprints among its tools); with chat (and its model), the chat doors and, when it asks for
// one, the summarizer.
func NewGateway(nc *nats.Conn, b *bus.Bus, cfg gateway.Config, chatCfg *ChatConfig) (*GatewayService, error) {
	cfg.Conn, cfg.Bus, cfg.Logger = nc, b, orDiscard(cfg.Logger).With("service", "gateway")
	log := cfg.Logger
	g, err := gateway.New(cfg)
	if err != nil {
		return nil, err
	}
	gs := &GatewayService{Gateway: g}
	gs.Beside.Add(service.Front, &ingress.Ingress{Bus: b, Submit: g.Submitter(), Admit: g.Admitter(), Limits: cfg.Limits, Logger: log.With("part", "ingress")})
	gs.Beside.Add(service.Front, &ingress.Service{Conn: nc, Submit: g.Submitter(), Admit: g.Admitter(), Reader: requestReader{g.Submitter(), g.Admitter()}, Record: b.JS,
		Limits: cfg.Limits, Wait: cfg.DefaultWait,
		MaxWait: cfg.MaxWait, Instance: cfg.Instance, Logger: log.With("part", "micro")})
	gs.Beside.Add(service.Back, &ingress.Outbox{Conn: nc, Owners: g.Admitter(), Responses: b, Logger: log.With("part", "outbox")})
	if b.Contracts == nil || b.Sessions == nil {
		return gs, nil
	}
	live := registry.NewLive(b.Contracts, log.With("part", "contracts"))
	gs.Beside.Add(service.Back, service.Func("contracts followed", live.Run))
	m, err := mcpserver.New(mcpserver.Env{Submit: g.Submitter(), Admit: g.Admitter(), Contracts: live, Sessions: b.Sessions,
		Limits: cfg.Limits, MaxBodyBytes: cfg.MaxBodyBytes, MaxWait: cfg.MaxWait, Offers: g.Offers, Blueprints: g.Blueprints, RunBlueprint: g.RunBlueprint,
		Logger: log.With("part", "mcp")})
	if err != nil {
		return nil, err
	}
	g.Mount(m)
	if chatCfg == nil || chatCfg.LLM == nil {
		return gs, nil
	}
	pub := b.NewPublisher(protocol.Sender{Role: protocol.RoleGateway, Instance: cfg.Instance})
	var confirm chat.Approvals
	if d := g.Decisions(); d != nil {
		confirm = d
	}
	env := chat.Env{Submit: g.Submitter(), Admit: g.Admitter(), Publisher: pub, Contracts: live, Sessions: b.Sessions,
		Record: b.JS, Limits: cfg.Limits, MaxBodyBytes: cfg.MaxBodyBytes, MaxWait: cfg.MaxWait, Offers: g.Offers, Approvals: confirm,
		Blueprints: g.Blueprints, RunBlueprint: g.RunBlueprint, Logger: log.With("part", "chat")}
	if l := g.BuiltinPolicies(); l != nil {
		env.Builtin = l
	}
	if mc := chatCfg.Memory; mc != nil && g.Memory() != nil {
		g.Memory().Decay = mc.Intent.Durations()
		env.Memory, env.MemoryConfig = g.Memory(), mc
	}
	c, err := chat.New(chatCfg.Config, env)
	if err != nil {
		return nil, err
	}
	g.Mount(c)
	if chatCfg.Prefilter.Embedder != nil {
		gs.Beside.Add(service.Back, service.Func("the tools' vectors, asked for ahead", c.Run))
	}
	if chatCfg.SummarizeEvery > 0 {
		s := &summarize.Service{Bus: b, Publisher: pub, LLM: chatCfg.LLM, Every: chatCfg.SummarizeEvery, RunTimeout: chatCfg.RunTimeout,
			Logger: log.With("part", "summarizer")}
		if m := cfg.Metrics; m != nil {
			s.Summarized = func(ok bool) {
				outcome := "ok"
				if !ok {
					outcome = "failed"
				}
				m.LLMSummaries.WithLabelValues(outcome).Inc()
			}
		}
		gs.Beside.Add(service.Back, s)
	}
	return gs, nil
}
