package bskyrpc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/sluice-dev/sluice/api/bsky"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// publishedCommit is the bluesky-social/atproto commit testdata/bsky.proto
// was copied from (packages/bsky/proto/bsky.proto).
const publishedCommit = "d6296a1cfdb40a773319cb59061300e4e8e52f26"

// Tests sluice's bsky.Service contract against the published one: every
// message proto/bsky declares (read from the source file, and as compiled
// into api/bsky) must exist in the published bsky.proto with the same
// fields (numbers, names, types, cardinality and presence), and every
// method sluice declares must exist there with the same request and
// response types. The published methods sluice does not declare are
// listed in the test log.
func TestContract(t *testing.T) {
	published := compile(t, "testdata", "bsky.proto")
	source := compile(t, filepath.Join("..", "..", "proto"), "bsky/bsky.proto")
	for name, ours := range map[string]protoreflect.FileDescriptor{
		"proto/bsky/bsky.proto": source,
		"api/bsky (generated)":  bsky.File_bsky_bsky_proto,
	} {
		for _, d := range compareFiles(ours, published) {
			t.Errorf("%s differs from the published bsky.proto (atproto %s): %s", name, publishedCommit[:10], d)
		}
	}
	var unserved []string
	svc := published.Services().ByName("Service")
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		if source.Services().ByName("Service").Methods().ByName(m.Name()) == nil {
			unserved = append(unserved, string(m.Name()))
		}
	}
	t.Logf("published bsky.Service methods sluice does not declare (%d of %d; they answer UNIMPLEMENTED): %s",
		len(unserved), svc.Methods().Len(), strings.Join(unserved, ", "))
	if served := svc.Methods().Len() - len(unserved); served != 21 {
		t.Errorf("sluice declares %d published methods, want the 19 record reads and the 2 standard.site reads", served)
	}
}

// compile parses and links one .proto file, with the well-known types.
func compile(t *testing.T, dir, file string) protoreflect.FileDescriptor {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
		t.Fatal(err)
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{dir}})}
	files, err := c.Compile(context.Background(), file)
	if err != nil {
		t.Fatalf("compile %s: %v", filepath.Join(dir, file), err)
	}
	return files[0]
}

// compareFiles lists every way ours departs from published: a message,
// field or method ours declares that published lacks or declares
// otherwise. What only published declares is not a difference.
func compareFiles(ours, published protoreflect.FileDescriptor) []string {
	var diffs []string
	if ours.Package() != published.Package() {
		diffs = append(diffs, fmt.Sprintf("package %s, published %s", ours.Package(), published.Package()))
	}
	for i := range ours.Messages().Len() {
		diffs = append(diffs, compareMessages(ours.Messages().Get(i), published.Messages())...)
	}
	for i := range ours.Services().Len() {
		s := ours.Services().Get(i)
		ps := published.Services().ByName(s.Name())
		if ps == nil {
			diffs = append(diffs, fmt.Sprintf("service %s is not published", s.Name()))
			continue
		}
		for j := range s.Methods().Len() {
			m := s.Methods().Get(j)
			pm := ps.Methods().ByName(m.Name())
			switch {
			case pm == nil:
				diffs = append(diffs, fmt.Sprintf("method %s.%s is not published", s.Name(), m.Name()))
			case m.Input().FullName() != pm.Input().FullName() || m.Output().FullName() != pm.Output().FullName() ||
				m.IsStreamingClient() != pm.IsStreamingClient() || m.IsStreamingServer() != pm.IsStreamingServer():
				diffs = append(diffs, fmt.Sprintf("method %s.%s is %s, published %s", s.Name(), m.Name(), signature(m), signature(pm)))
			}
		}
	}
	return diffs
}

func compareMessages(m protoreflect.MessageDescriptor, published protoreflect.MessageDescriptors) []string {
	pm := published.ByName(m.Name())
	if pm == nil {
		return []string{fmt.Sprintf("message %s is not published", m.FullName())}
	}
	var diffs []string
	for i := range m.Fields().Len() {
		f := m.Fields().Get(i)
		pf := pm.Fields().ByName(f.Name())
		switch {
		case pf == nil:
			diffs = append(diffs, fmt.Sprintf("field %s is not published", f.FullName()))
		case describe(f) != describe(pf):
			diffs = append(diffs, fmt.Sprintf("field %s is %s, published %s", f.FullName(), describe(f), describe(pf)))
		}
	}
	for i := range m.Messages().Len() {
		diffs = append(diffs, compareMessages(m.Messages().Get(i), pm.Messages())...)
	}
	return diffs
}

// describe is everything about a field the wire and generated clients
// depend on: number, cardinality, presence and type.
func describe(f protoreflect.FieldDescriptor) string {
	typ := f.Kind().String()
	switch {
	case f.Message() != nil:
		typ = string(f.Message().FullName())
	case f.Enum() != nil:
		typ = string(f.Enum().FullName())
	}
	return fmt.Sprintf("%d %s %s presence=%v", f.Number(), f.Cardinality(), typ, f.HasPresence())
}

func signature(m protoreflect.MethodDescriptor) string {
	return fmt.Sprintf("(%s) returns (%s) client-stream=%v server-stream=%v", m.Input().FullName(), m.Output().FullName(), m.IsStreamingClient(), m.IsStreamingServer())
}
