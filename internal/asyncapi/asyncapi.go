// Package asyncapi describes Hermes' public subjects as an AsyncAPI 3.0 document: what an
// external NATS client may publish (a request into the clients' stream), the micro service it
// may call (hermes, endpoint request) and what it answers, and what NATS micro discovery shows
// of the tool workers. Its messages' JSON Schemas are reflected from pkg/protocol's types, so
// the document changes when they do; api/asyncapi.json in the repository is this document (a
// test compares them), and every gateway serves it (GET /v1/asyncapi.json).
package asyncapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/invopop/jsonschema"

	"github.com/hermesbus/hermes/internal/discovery"
	"github.com/hermesbus/hermes/internal/ingress"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// RequestFields are the fields of a HermesRequest a client writes (protocol.DecodeRequestJSON
// takes these and no other); the rest of protocol.Request is Hermes' own.
var RequestFields = []string{"request_id", "session_id", "intent", "tool_calls", "serial", "user"}

// schemaOf is t's JSON Schema, inline, as its JSON tags say.
func schemaOf(v any) map[string]any {
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, RequiredFromJSONSchemaTags: true, AllowAdditionalProperties: true}
	s := r.Reflect(v)
	s.Version, s.ID = "", ""
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("asyncapi: the schema of %T: %v", v, err))
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("asyncapi: the schema of %T: %v", v, err))
	}
	return out
}

// requestSchema is the schema of what a client publishes: protocol.Request's RequestFields,
// no others, request_id and tool_calls required.
func requestSchema() map[string]any {
	s := schemaOf(&protocol.Request{})
	props := s["properties"].(map[string]any)
	for name := range props {
		if !slices.Contains(RequestFields, name) {
			delete(props, name)
		}
	}
	s["required"] = []string{"request_id", "tool_calls"}
	s["additionalProperties"] = false
	s["description"] = "A request of tool calls, as POST /v1/route takes it. The session is session_id, else request_id. Ids are subject tokens: letters, digits, '-' and '_'."
	return s
}

func header(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }

// Document is the AsyncAPI 3.0 document of Hermes' public subjects.
func Document() map[string]any {
	contentType := header("application/json (this document's messages), or application/msgpack for the envelope Hermes' services write (the default when absent)")
	trace := map[string]any{
		bus.HeaderTraceID:     header("a correlation id, kept through the request's messages"),
		bus.HeaderTraceparent: header("W3C trace context"),
		bus.HeaderTracestate:  header("W3C trace context"),
	}
	requestHeaders := map[string]any{"type": "object", "properties": merge(map[string]any{bus.HeaderContentType: contentType}, trace)}
	callHeaders := map[string]any{"type": "object", "properties": merge(map[string]any{
		bus.HeaderContentType: header("application/json"),
		ingress.HeaderWait:    header("how long to wait for the response: a Go duration (90s); default 30s, at most 5m"),
	}, trace)}
	user := map[string]any{"description": "the client's NATS user: the only one its permissions allow in the subject"}
	return map[string]any{
		"asyncapi": "3.0.0",
		"info": map[string]any{
			"title":   "Hermes",
			"version": ingress.Version,
			"description": "Hermes, a message bus for AI agents, as NATS clients in any language reach it: publish a request of tool calls " +
				"into the clients' stream, or call the micro service hermes and get the response. Every client is a NATS user of its own " +
				"(hermes nats-auth --client NAME) in the account CLIENTS, that may publish under its own name only and receive on its own inbox (_INBOX_NAME).",
		},
		"defaultContentType": protocol.ContentTypeJSON,
		"servers": map[string]any{
			"nats": map[string]any{"host": "127.0.0.1:4222", "protocol": "nats",
				"description": "hermes up's embedded server; a deployment's over TLS (tls://nats:4222)"},
		},
		"channels": map[string]any{
			"clientRequests": map[string]any{
				"address":     "hermes.client.{user}.{session}",
				"description": "A client's requests, published with JetStream into the stream HERMES_CLIENTS (acknowledged there); gateways take them in order and submit each as the client. What can never be submitted is a dead letter naming why (hermes dlq ls).",
				"parameters":  map[string]any{"user": user, "session": map[string]any{"description": "the request's session"}},
				"messages":    map[string]any{"hermesRequest": map[string]any{"$ref": "#/components/messages/hermesRequest"}},
			},
			"clientResponses": map[string]any{
				"address":     protocol.SubjectClientResponse("{user}", "{session}", "{request_id}"),
				"description": "The responses of the client's requests, sent as each is recorded (the clients' account imports these subjects; each client may subscribe to its own only). Not kept: a client that was not listening reads a response on the endpoint response.",
				"parameters": map[string]any{"user": user, "session": map[string]any{"description": "the request's session"},
					"request_id": map[string]any{"description": "the request"}},
				"messages": map[string]any{"hermesResponse": map[string]any{"$ref": "#/components/messages/hermesResponse"}},
			},
			"serviceRequest": map[string]any{
				"address":     protocol.SubjectClientService("{user}", protocol.EndpointRequest),
				"description": "The micro service hermes, endpoint request (queue group hermes, served by every gateway).",
				"parameters":  map[string]any{"user": user},
				"messages":    map[string]any{"hermesCall": map[string]any{"$ref": "#/components/messages/hermesCall"}},
			},
			"serviceResponse": map[string]any{
				"address":     protocol.SubjectClientService("{user}", protocol.EndpointResponse),
				"description": "The micro service hermes, endpoint response: the response of a request the client published, by its request_id (only of a session the client owns).",
				"parameters":  map[string]any{"user": user},
				"messages":    map[string]any{"responseAsk": map[string]any{"$ref": "#/components/messages/responseAsk"}},
			},
			"serviceFollow": map[string]any{
				"address":     protocol.SubjectClientService("{user}", protocol.EndpointFollow),
				"description": "The micro service hermes, endpoint follow: send the client the messages of one of its sessions (history, then each new one) on clientSession, for `for` (default 1m, at most 10m). It answers {session_id, subject, until} at once: subscribe first.",
				"parameters":  map[string]any{"user": user},
				"messages":    map[string]any{"followAsk": map[string]any{"$ref": "#/components/messages/followAsk"}},
			},
			"clientSession": map[string]any{
				"address":     protocol.SubjectClientSession("{user}", "{session}"),
				"description": "The messages of a session the client follows, as the record keeps them (JSON), each with the header " + ingress.HeaderSeq + " (its record sequence); the last, empty, has " + ingress.HeaderEnd + " saying why the follow ended.",
				"parameters":  map[string]any{"user": user, "session": map[string]any{"description": "the session"}},
				"messages":    map[string]any{"recordEntry": map[string]any{"$ref": "#/components/messages/recordEntry"}},
			},
			"serviceReply": map[string]any{
				"address":     nil,
				"description": "The caller's reply subject (its inbox).",
				"messages": map[string]any{
					"hermesResponse": map[string]any{"$ref": "#/components/messages/hermesResponse"},
					"serviceError":   map[string]any{"$ref": "#/components/messages/serviceError"},
				},
			},
			"toolFigures": map[string]any{
				"address":     "hermes.svc.toolworker.{instance}.{tool}",
				"description": "A tool worker's endpoint of service " + discovery.WorkerService + ": asked, it answers what the worker ran of the tool (NATS micro discovery: $SRV.PING, $SRV.INFO, $SRV.STATS).",
				"parameters":  map[string]any{"instance": map[string]any{"description": "the worker's instance"}, "tool": map[string]any{"description": "the tool"}},
				"messages":    map[string]any{"toolFigures": map[string]any{"$ref": "#/components/messages/toolFigures"}},
			},
		},
		"operations": map[string]any{
			"publishRequest": map[string]any{"action": "send", "channel": map[string]any{"$ref": "#/channels/clientRequests"},
				"summary": "Publish a request (fire and forget; read its response through a gateway)"},
			"hearResponses": map[string]any{"action": "receive", "channel": map[string]any{"$ref": "#/channels/clientResponses"},
				"summary": "Hear the responses of one's requests as they are recorded"},
			"callRequest": map[string]any{"action": "send", "channel": map[string]any{"$ref": "#/channels/serviceRequest"},
				"summary": "Submit a request and get its response once it is done",
				"reply":   map[string]any{"channel": map[string]any{"$ref": "#/channels/serviceReply"}}},
			"fetchResponse": map[string]any{"action": "send", "channel": map[string]any{"$ref": "#/channels/serviceResponse"},
				"summary": "Read the response of a request published before: the response, or {request_id, status: pending}",
				"reply":   map[string]any{"channel": map[string]any{"$ref": "#/channels/serviceReply"}}},
			"followSession": map[string]any{"action": "send", "channel": map[string]any{"$ref": "#/channels/serviceFollow"},
				"summary": "Follow one of one's sessions", "reply": map[string]any{"channel": map[string]any{"$ref": "#/channels/serviceReply"}}},
			"hearSession": map[string]any{"action": "receive", "channel": map[string]any{"$ref": "#/channels/clientSession"},
				"summary": "Hear a followed session's messages"},
			"askToolFigures": map[string]any{"action": "send", "channel": map[string]any{"$ref": "#/channels/toolFigures"},
				"summary": "Ask a tool worker what it ran of a tool (operators)",
				"reply":   map[string]any{"channel": map[string]any{"$ref": "#/channels/serviceReply"}}},
		},
		"components": map[string]any{
			"messages": map[string]any{
				"hermesRequest": map[string]any{"name": "HermesRequest", "contentType": protocol.ContentTypeJSON, "headers": requestHeaders,
					"payload": requestSchema()},
				"hermesCall": map[string]any{"name": "HermesRequest", "contentType": protocol.ContentTypeJSON, "headers": callHeaders,
					"payload": requestSchema()},
				"hermesResponse": map[string]any{"name": "HermesResponse", "contentType": protocol.ContentTypeJSON,
					"summary": "The request's response: one result per call, matched by tool_call_id", "payload": schemaOf(&protocol.Response{})},
				"serviceError": map[string]any{"name": "ServiceError", "contentType": protocol.ContentTypeJSON,
					"summary": "An error reply: the headers Nats-Service-Error-Code (an HTTP status) and Nats-Service-Error (the message)",
					"headers": map[string]any{"type": "object", "properties": map[string]any{
						"Nats-Service-Error-Code": header("an HTTP status: 400, 404, 409, 413, 429, 503, 504"),
						"Nats-Service-Error":      header("the message"),
					}},
					"payload": schemaOf(&ingress.ServiceError{})},
				"responseAsk": map[string]any{"name": "ResponseAsk", "contentType": protocol.ContentTypeJSON, "payload": map[string]any{
					"type": "object", "additionalProperties": false, "required": []string{"request_id"},
					"properties": map[string]any{"request_id": map[string]any{"type": "string"}}}},
				"followAsk": map[string]any{"name": "FollowAsk", "contentType": protocol.ContentTypeJSON, "payload": map[string]any{
					"type": "object", "additionalProperties": false, "required": []string{"session_id"},
					"properties": map[string]any{"session_id": map[string]any{"type": "string"},
						"for":   map[string]any{"type": "string", "description": "a Go duration: 5m"},
						"after": map[string]any{"type": "integer", "description": "follow from the message after this record sequence"}}}},
				"recordEntry": map[string]any{"name": "RecordEntry", "contentType": protocol.ContentTypeJSON,
					"summary": "One message of the record: seq, subject, time, type, msg_id, session_id, request_id, causation_id, payload (as GET /v1/sessions/{id}/events sends it)",
					"payload": map[string]any{"type": "object"}},
				"toolFigures": map[string]any{"name": "ToolFigures", "contentType": protocol.ContentTypeJSON, "payload": schemaOf(&discovery.Figures{})},
			},
		},
	}
}

func merge(a, b map[string]any) map[string]any {
	maps.Copy(a, b)
	return a
}

// JSON is Document as indented JSON, keys sorted: the bytes of api/asyncapi.json.
func JSON() []byte {
	b, err := json.MarshalIndent(Document(), "", "  ")
	if err != nil {
		panic(fmt.Sprintf("asyncapi: %v", err))
	}
	var out bytes.Buffer
	out.Write(b)
	out.WriteByte('\n')
	return out.Bytes()
}
