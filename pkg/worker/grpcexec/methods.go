package grpcexec

import (
	"context"
	"errors"
	"fmt"
	"io"
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
)

// Bounds on what a server's reflection or a descriptor set may make a worker hold.
const (
	// maxDescriptorFiles bounds the files one method's descriptors may span.
	maxDescriptorFiles = 512
	// maxDescriptorBytes bounds their serialized size, and a descriptor set file's.
	maxDescriptorBytes = 16 << 20
	// methodTTL is how long a method found is used before it is looked up again (a server
	// redeployed with a changed schema is followed within it; UNIMPLEMENTED drops it at once).
	methodTTL = time.Minute
	// maxMethods bounds the methods remembered.
	maxMethods = 1024
)

// method is a resolved unary method and the types its messages may hold (for Any).
type method struct {
	desc  protoreflect.MethodDescriptor
	types *dynamicpb.Types
	// via says where it was found: "reflection" or "descriptor set NAME".
	via string
}

// unknownMethod is a method that could not be found, for a reason the route's author must fix
// (GRPC_METHOD_UNKNOWN, never retried); other errors are the server's reachability.
type unknownMethod struct{ msg string }

func (e *unknownMethod) Error() string { return e.msg }

func unknownf(format string, args ...any) error {
	return &unknownMethod{msg: fmt.Sprintf(format, args...)}
}

// methodKey names a method where it is served and how it is described.
type methodKey struct {
	conn                           connKey
	service, method, descriptorSet string
}

// methodEntry is one lookup: done closes when desc or err is set; calls that need the same
// method meanwhile wait for it rather than asking the server again.
type methodEntry struct {
	done    chan struct{}
	m       *method
	err     error
	expires time.Time
}

// methods finds and remembers methods.
type methods struct {
	dir string // descriptor sets' directory; "" for none

	mu      sync.Mutex
	entries map[methodKey]*methodEntry
}

// find returns the method k names, looked up on cc (reflection) or in the route's descriptor
// set, and remembered for methodTTL.
func (ms *methods) find(ctx context.Context, cc *grpc.ClientConn, k methodKey) (*method, error) {
	ms.mu.Lock()
	e, ok := ms.entries[k]
	if ok && e.err == nil && !e.expires.IsZero() && time.Now().After(e.expires) {
		delete(ms.entries, k)
		ok = false
	}
	if !ok {
		if len(ms.entries) >= maxMethods {
			for old, oe := range ms.entries { // drop one finished entry; any will do
				if !oe.expires.IsZero() {
					delete(ms.entries, old)
					break
				}
			}
		}
		e = &methodEntry{done: make(chan struct{})}
		ms.entries[k] = e
		ms.mu.Unlock()
		// The lookup is the first call's, but serves every call waiting: it runs under a
		// context of its own, bounded, so one caller's cancellation fails no other.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		e.m, e.err = ms.lookup(lctx, cc, k)
		cancel()
		ms.mu.Lock()
		if e.err != nil {
			delete(ms.entries, k) // the next call asks again
		} else {
			e.expires = time.Now().Add(methodTTL)
		}
		close(e.done)
	}
	ms.mu.Unlock()
	select {
	case <-e.done:
		return e.m, e.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// forget drops what is remembered of k (the server answered UNIMPLEMENTED: it changed).
func (ms *methods) forget(k methodKey) {
	ms.mu.Lock()
	if e, ok := ms.entries[k]; ok && !e.expires.IsZero() {
		delete(ms.entries, k)
	}
	ms.mu.Unlock()
}

func (ms *methods) lookup(ctx context.Context, cc *grpc.ClientConn, k methodKey) (*method, error) {
	var (
		files *protoregistry.Files
		via   string
		err   error
	)
	if k.descriptorSet != "" {
		via = "descriptor set " + k.descriptorSet
		files, err = ms.descriptorSet(k.descriptorSet)
	} else {
		via = "server reflection"
		files, err = reflect(ctx, cc, k.service)
	}
	if err != nil {
		return nil, err
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(k.service))
	if err != nil {
		return nil, unknownf("%s does not describe the service %s", via, k.service)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, unknownf("%s is not a service in %s", k.service, via)
	}
	md := sd.Methods().ByName(protoreflect.Name(k.method))
	if md == nil {
		var names []string
		for i := range sd.Methods().Len() {
			names = append(names, string(sd.Methods().Get(i).Name()))
		}
		return nil, unknownf("the service %s has no method %s (it has: %s)", k.service, k.method, strings.Join(names, ", "))
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, unknownf("%s/%s is a streaming method; Hermes calls unary methods only", k.service, k.method)
	}
	return &method{desc: md, types: dynamicpb.NewTypes(files), via: via}, nil
}

// descriptorSet reads the FileDescriptorSet file name in the descriptor directory.
func (ms *methods) descriptorSet(name string) (*protoregistry.Files, error) {
	if ms.dir == "" {
		return nil, unknownf("the route names the descriptor set %s, but this worker has no --grpc-descriptors directory", name)
	}
	if filepath.Base(name) != name || name == "." || name == ".." {
		return nil, unknownf("descriptor set %q is not a file name", name)
	}
	f, err := os.Open(filepath.Join(ms.dir, name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, unknownf("descriptor set %s is not in this worker's --grpc-descriptors directory", name)
		}
		return nil, unknownf("descriptor set %s: %v", name, errors.Unwrap(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDescriptorBytes+1))
	if err != nil {
		return nil, unknownf("descriptor set %s: %v", name, err)
	}
	if len(data) > maxDescriptorBytes {
		return nil, unknownf("descriptor set %s is larger than %d bytes", name, maxDescriptorBytes)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(data, &set); err != nil {
		return nil, unknownf("descriptor set %s is not a FileDescriptorSet (protoc --descriptor_set_out): %v", name, err)
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	for _, fd := range set.File {
		byName[fd.GetName()] = fd
	}
	files, err := buildFiles(byName, "descriptor set "+name)
	if err != nil {
		return nil, err
	}
	return files, nil
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
// import, by server reflection (v1, else v1alpha).
func reflect(ctx context.Context, cc *grpc.ClientConn, service string) (*protoregistry.Files, error) {
	var err error
	for _, m := range reflectionMethods {
		var byName map[string]*descriptorpb.FileDescriptorProto
		byName, err = reflectFiles(ctx, cc, m, service)
		if status.Code(err) == codes.Unimplemented {
			continue
		}
		if err != nil {
			switch status.Code(err) {
			case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
				return nil, err // the server's reachability, or the try's end
			}
			var um *unknownMethod
			if !errors.As(err, &um) {
				err = unknownf("the server's reflection failed: %s", status.Convert(err).Message())
			}
			return nil, err
		}
		return buildFiles(byName, "the server's reflection")
	}
	return nil, unknownf("the server offers no server reflection (%s) and the route names no descriptor_set: "+
		"turn reflection on in the server, or give the route a descriptor_set from the worker's --grpc-descriptors directory", status.Convert(err).Message())
}

// reflectFiles runs one reflection stream: the file that holds service, then each import the
// server has not given yet.
func reflectFiles(ctx context.Context, cc *grpc.ClientConn, method, service string) (map[string]*descriptorpb.FileDescriptorProto, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return nil, err
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	size := 0
	ask := func(req *rpb.ServerReflectionRequest, what string) error {
		if err := stream.SendMsg(req); err != nil {
			return err
		}
		var resp rpb.ServerReflectionResponse
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
			}
		}
		return nil
	}
	if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: service}}, "the service "+service); err != nil {
		return nil, err
	}
	// Imports the server left out (it may send only the file asked for), each asked once.
	asked := map[string]bool{}
	for {
		missing := ""
		for _, fd := range byName {
			for _, dep := range fd.GetDependency() {
				if _, ok := byName[dep]; !ok && !asked[dep] {
					if _, err := protoregistry.GlobalFiles.FindFileByPath(dep); err != nil {
						missing = dep
					}
				}
			}
		}
		if missing == "" {
			break
		}
		asked[missing] = true
		if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: missing}}, missing); err != nil {
			return nil, err
		}
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	return byName, nil
}
