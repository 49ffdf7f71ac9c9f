package grpcexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// Bounds on what a server's reflection or a descriptor set may make a worker hold.
const (
	// maxDescriptorFiles bounds the files one service's descriptors may span.
	maxDescriptorFiles = 512
	// maxDescriptorBytes bounds their serialized size, and a descriptor set file's.
	maxDescriptorBytes = 16 << 20
	// sourceTTL is how long descriptors found are used before they are asked for again (a
	// server redeployed with a changed schema is followed within it; UNIMPLEMENTED drops
	// them at once).
	sourceTTL = time.Minute
	// maxSources and maxSourceBytes bound the descriptors kept, in number and in serialized
	// bytes: past either, the least recently used are dropped (lookups still running are
	// not counted until they finish).
	maxSources     = 256
	maxSourceBytes = 64 << 20
	// lookupTimeout bounds one lookup, whoever waits for it.
	lookupTimeout = 10 * time.Second
)

// method is a resolved unary method and the types its messages may hold (for Any).
type method struct {
	desc  protoreflect.MethodDescriptor
	types *dynamicpb.Types
}

// unknownMethod is a method that could not be found, for a reason the route's author must fix
// (GRPC_METHOD_UNKNOWN, never retried); other errors are the server's reachability.
type unknownMethod struct{ msg string }

func (e *unknownMethod) Error() string { return e.msg }

func unknownf(format string, args ...any) error {
	return &unknownMethod{msg: fmt.Sprintf(format, args...)}
}

// reflectionStatus is a status the server answered to a reflection request (other than
// UNIMPLEMENTED, which means it has none).
type reflectionStatus struct{ st *status.Status }

func (e *reflectionStatus) Error() string {
	return "the server's reflection answered " + codeName(e.st.Code()) + ": " + e.st.Message()
}

// sourceKey names where descriptors come from: a descriptor set file (the same whatever the
// server or service), or the reflection of one service at one server asked with one set of
// credentials (a digest of the route's header values: a lookup, and its error, are never
// shared between routes that authenticate differently).
type sourceKey struct {
	conn          connKey
	service       string
	creds         string
	descriptorSet string
}

// source is one lookup of descriptors: done closes when files or err is set; calls that need
// them meanwhile wait for it rather than asking again.
type source struct {
	done    chan struct{}
	files   *protoregistry.Files
	types   *dynamicpb.Types
	err     error
	size    int       // serialized bytes of the descriptors; guarded by methods.mu
	expires time.Time // zero while the lookup runs; guarded by methods.mu
	used    time.Time // guarded by methods.mu
}

// methods finds and remembers services' descriptors.
type methods struct {
	dir string // descriptor sets' directory; "" for none
	log *slog.Logger

	mu      sync.Mutex
	sources map[sourceKey]*source
	bytes   int // of finished sources
}

// find returns the method service/name, its descriptors looked up as k says on cn (reflection)
// or in the route's descriptor set, and remembered for sourceTTL. It returns when ctx ends,
// whether or not the lookup has; the lookup runs on, bounded by lookupTimeout, for whoever
// waits next. What a failed lookup says has the values of secrets redacted.
func (ms *methods) find(ctx context.Context, cs *conns, cn *conn, k sourceKey, service, name string, secrets []string) (*method, error) {
	now := time.Now()
	ms.mu.Lock()
	src, ok := ms.sources[k]
	if ok && !src.expires.IsZero() && now.After(src.expires) {
		ms.dropLocked(k, src)
		ok = false
	}
	if !ok {
		src = &source{done: make(chan struct{})}
		ms.sources[k] = src
		cs.hold(cn)                        // the lookup's own hold on the connection: eviction leaves it open
		lctx := context.WithoutCancel(ctx) // the route's metadata, not the caller's end
		go ms.lookup(lctx, cs, cn, k, service, secrets, src)
	}
	src.used = now
	ms.mu.Unlock()
	select {
	case <-src.done:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if src.err != nil {
		return nil, src.err
	}
	return resolveMethod(src, k, service, name)
}

// lookup fills src, then keeps it (or, failed, forgets it: the next call asks again).
func (ms *methods) lookup(ctx context.Context, cs *conns, cn *conn, k sourceKey, service string, secrets []string, src *source) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	defer cs.put(cn)
	var (
		files *protoregistry.Files
		size  int
		err   error
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("grpcexec: looking up %s: %v", service, p)
			}
		}()
		if k.descriptorSet != "" {
			files, size, err = ms.descriptorSet(k.descriptorSet)
		} else {
			files, size, err = reflect(ctx, cn.cc, service)
		}
	}()
	err = redactError(err, secrets)
	ms.mu.Lock()
	defer ms.mu.Unlock()
	src.files, src.err, src.size = files, err, size
	if err == nil {
		ms.log.Debug("gRPC service described", "service", service, "target", k.conn.target, "descriptor_set", k.descriptorSet, "bytes", size)
	} else {
		ms.log.Debug("gRPC service not described", "service", service, "target", k.conn.target, "descriptor_set", k.descriptorSet, "err", err)
	}
	if err == nil {
		src.types = dynamicpb.NewTypes(files)
		src.expires = time.Now().Add(sourceTTL)
		ms.bytes += size
		ms.trimLocked(src)
	} else if ms.sources[k] == src {
		delete(ms.sources, k)
	}
	close(src.done)
}

// trimLocked drops the least recently used finished sources, other than keep, while the
// bounds are passed.
func (ms *methods) trimLocked(keep *source) {
	for len(ms.sources) > maxSources || ms.bytes > maxSourceBytes {
		var (
			oldK sourceKey
			old  *source
		)
		for k, s := range ms.sources {
			if s != keep && !s.expires.IsZero() && (old == nil || s.used.Before(old.used)) {
				oldK, old = k, s
			}
		}
		if old == nil {
			return
		}
		ms.dropLocked(oldK, old)
	}
}

func (ms *methods) dropLocked(k sourceKey, s *source) {
	if ms.sources[k] == s {
		delete(ms.sources, k)
		if !s.expires.IsZero() {
			ms.bytes -= s.size
		}
	}
}

// forget drops what is remembered of k (the server answered UNIMPLEMENTED: it changed).
func (ms *methods) forget(k sourceKey) {
	ms.mu.Lock()
	if s, ok := ms.sources[k]; ok && !s.expires.IsZero() {
		ms.dropLocked(k, s)
	}
	ms.mu.Unlock()
}

// resolveMethod finds the unary method service/name in src, which k names.
func resolveMethod(src *source, k sourceKey, service, name string) (*method, error) {
	via := "server reflection"
	if k.descriptorSet != "" {
		via = "descriptor set " + k.descriptorSet
	}
	d, err := src.files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, unknownf("%s does not describe the service %s", via, service)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, unknownf("%s is not a service in %s", service, via)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		var names []string
		for i := range sd.Methods().Len() {
			names = append(names, string(sd.Methods().Get(i).Name()))
		}
		return nil, unknownf("the service %s has no method %s (it has: %s)", service, name, strings.Join(names, ", "))
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, unknownf("%s/%s is a streaming method; Hermes calls unary methods only", service, name)
	}
	return &method{desc: md, types: src.types}, nil
}

// descriptorSet reads the FileDescriptorSet file name in the descriptor directory.
func (ms *methods) descriptorSet(name string) (*protoregistry.Files, int, error) {
	if ms.dir == "" {
		return nil, 0, unknownf("the route names the descriptor set %s, but this worker has no --grpc-descriptors directory", name)
	}
	if filepath.Base(name) != name || name == "." || name == ".." {
		return nil, 0, unknownf("descriptor set %q is not a file name", name)
	}
	f, err := os.Open(filepath.Join(ms.dir, name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, 0, unknownf("descriptor set %s is not in this worker's --grpc-descriptors directory", name)
		}
		return nil, 0, unknownf("descriptor set %s: %v", name, errors.Unwrap(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDescriptorBytes+1))
	if err != nil {
		return nil, 0, unknownf("descriptor set %s: %v", name, err)
	}
	if len(data) > maxDescriptorBytes {
		return nil, 0, unknownf("descriptor set %s is larger than %d bytes", name, maxDescriptorBytes)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(data, &set); err != nil {
		return nil, 0, unknownf("descriptor set %s is not a FileDescriptorSet (protoc --descriptor_set_out): %v", name, err)
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	for _, fd := range set.File {
		byName[fd.GetName()] = fd
	}
	files, err := buildFiles(byName, "descriptor set "+name)
	if err != nil {
		return nil, 0, err
	}
	return files, len(data), nil
}

// buildFiles links file descriptors into a registry, each after the files it imports; an
// import none of them holds is taken from the descriptors compiled into this program (the
// well-known types), else it is an error naming it.
func buildFiles(byName map[string]*descriptorpb.FileDescriptorProto, from string) (*protoregistry.Files, error) {
	files := &protoregistry.Files{}
	visiting := map[string]bool{}
	var add func(name, by string) error
	add = func(name, by string) error {
		if _, err := files.FindFileByPath(name); err == nil {
			return nil
		}
		fdp, ok := byName[name]
		if !ok {
			if fd, err := protoregistry.GlobalFiles.FindFileByPath(name); err == nil {
				return files.RegisterFile(fd)
			}
			hint := ""
			if strings.HasPrefix(from, "descriptor set") {
				hint = " (make it with protoc --include_imports)"
			}
			return unknownf("%s lacks %s, which %s imports%s", from, name, by, hint)
		}
		if visiting[name] {
			return unknownf("%s: %s imports itself through %s", from, name, by)
		}
		visiting[name] = true
		for _, dep := range fdp.GetDependency() {
			if err := add(dep, name); err != nil {
				return err
			}
		}
		fd, err := protodesc.NewFile(fdp, files)
		if err != nil {
			return unknownf("%s: %s: %v", from, name, err)
		}
		if err := files.RegisterFile(fd); err != nil {
			return unknownf("%s: %s: %v", from, name, err)
		}
		return nil
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := add(n, from); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// The reflection services asked, newest first: both carry the same messages.
var reflectionMethods = []string{
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}

// reflect asks the server on cc for the files that describe service and everything they
// import, by server reflection (v1, else v1alpha), and says how many bytes they hold. A status
// the server answers is a *reflectionStatus; any other error is the connection's, or the
// lookup's end.
func reflect(ctx context.Context, cc *grpc.ClientConn, service string) (*protoregistry.Files, int, error) {
	for _, m := range reflectionMethods {
		mctx, mark := withAnswerMark(ctx)
		byName, size, err := reflectFiles(mctx, cc, m, service)
		var um *unknownMethod
		switch {
		case err == nil:
			files, err := buildFiles(byName, "the server's reflection")
			return files, size, err
		case errors.As(err, &um):
			return nil, 0, err
		case mark.v.Load() && status.Code(err) == codes.Unimplemented:
			continue // not this version of reflection
		case mark.v.Load():
			return nil, 0, &reflectionStatus{st: status.Convert(err)}
		default:
			return nil, 0, err
		}
	}
	return nil, 0, unknownf("the server offers no server reflection and the route names no descriptor_set: " +
		"turn reflection on in the server, or give the route a descriptor_set from the worker's --grpc-descriptors directory")
}

// reflectFiles runs one reflection stream: the file that holds service, then each import the
// server has not given yet.
func reflectFiles(ctx context.Context, cc *grpc.ClientConn, method, service string) (map[string]*descriptorpb.FileDescriptorProto, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return nil, 0, err
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	var order []string // byName's files, as they came
	size := 0
	ask := func(req *rpb.ServerReflectionRequest, what string) error {
		var resp rpb.ServerReflectionResponse
		if err := stream.SendMsg(req); err != nil {
			if errors.Is(err, io.EOF) { // the stream ended: its status is what RecvMsg says
				if err = stream.RecvMsg(&resp); err == nil {
					err = io.ErrUnexpectedEOF
				}
			}
			return err
		}
		if err := stream.RecvMsg(&resp); err != nil {
			return err
		}
		if e := resp.GetErrorResponse(); e != nil {
			if codes.Code(e.GetErrorCode()) == codes.NotFound {
				return unknownf("the server's reflection does not know %s", what)
			}
			return unknownf("the server's reflection could not give %s: %s", what, e.GetErrorMessage())
		}
		fr := resp.GetFileDescriptorResponse()
		if fr == nil {
			return unknownf("the server's reflection answered something else than the files of %s", what)
		}
		for _, raw := range fr.GetFileDescriptorProto() {
			size += len(raw)
			if size > maxDescriptorBytes || len(byName) >= maxDescriptorFiles {
				return unknownf("the server's reflection gave more than %d files or %d bytes for %s", maxDescriptorFiles, maxDescriptorBytes, what)
			}
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				return unknownf("the server's reflection gave a file that does not parse: %v", err)
			}
			if _, ok := byName[fd.GetName()]; !ok {
				byName[fd.GetName()] = fd
				order = append(order, fd.GetName())
			}
		}
		return nil
	}
	if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: service}}, "the service "+service); err != nil {
		return nil, 0, err
	}
	// Imports the server left out (it may send only the file asked for), each asked once, at
	// most maxDescriptorFiles requests in all; an answer without the file asked for ends it.
	asked := map[string]bool{}
	var queue []string
	seen := 0 // files of order whose imports are queued
	for requests := 0; ; requests++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		for _, n := range order[seen:] { // files added since: queue their imports
			for _, dep := range byName[n].GetDependency() {
				if _, ok := byName[dep]; !ok && !asked[dep] {
					if _, err := protoregistry.GlobalFiles.FindFileByPath(dep); err != nil {
						asked[dep] = true
						queue = append(queue, dep)
					}
				}
			}
		}
		seen = len(order)
		if len(queue) == 0 {
			break
		}
		if requests >= maxDescriptorFiles {
			return nil, 0, unknownf("the server's reflection left more than %d imports of %s to ask for", maxDescriptorFiles, service)
		}
		missing := queue[0]
		queue = queue[1:]
		if _, ok := byName[missing]; ok {
			continue
		}
		if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: missing}}, missing); err != nil {
			return nil, 0, err
		}
		if _, ok := byName[missing]; !ok {
			return nil, 0, unknownf("the server's reflection did not give %s when asked for it", missing)
		}
	}
	if err := stream.CloseSend(); err != nil {
		return nil, 0, err
	}
	return byName, size, nil
}

// redactError is err with the values of secrets redacted from what the server said in it.
func redactError(err error, secrets []string) error {
	var (
		um *unknownMethod
		rs *reflectionStatus
	)
	redact := func(s string) string { return string(egress.Redact([]byte(s), secrets)) }
	switch {
	case len(secrets) == 0 || err == nil:
		return err
	case errors.As(err, &um):
		return &unknownMethod{msg: redact(um.msg)}
	case errors.As(err, &rs):
		return &reflectionStatus{st: status.New(rs.st.Code(), redact(rs.st.Message()))}
	}
	if st, ok := status.FromError(err); ok { // the connection's: its code kept
		return status.New(st.Code(), redact(st.Message())).Err()
	}
	return errors.New(redact(err.Error()))
}
