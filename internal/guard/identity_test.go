package guard_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tests that WithIdentity replaces the claimed name: the handler sees
// the name identify returns, and a refusal is PermissionDenied with its
// reason, decided before the shape check (a malformed request from a
// refused caller learns nothing about the shape rules) and before the
// handler runs. The caller is identified once per call: the stream's tap
// names it, and the request decoder and the interceptor reuse that name.
func TestWithIdentity(t *testing.T) {
	var identified atomic.Int64
	identify := func(ctx context.Context) (string, error) {
		identified.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		if len(md.Get("x-cert")) == 0 {
			return "", &identity.DeniedError{Reason: "no certificate"}
		}
		return "cert:" + md.Get("x-cert")[0], nil
	}
	f := start(t, testConfig(), newPostRecords(), guard.WithIdentity(identify))

	ctx := metadata.AppendToOutgoingContext(testContext(t, 5*time.Second), "x-cert", "feed", identity.ClientIDKey, "liar")
	if _, err := f.client.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]}); err != nil {
		t.Fatalf("GetPostRecord: %v", err)
	}
	if got := <-f.impl.clients; got != "cert:feed" {
		t.Errorf("handler saw client %q, want the identified cert:feed", got)
	}
	if n := identified.Load(); n != 1 {
		t.Errorf("the caller was identified %d times for one call, want once", n)
	}

	// Refused callers, on both methods: neither handler may run.
	calls := f.impl.calls.Load()
	_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{})
	st := status.Convert(err)
	if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "GetPostRecords: no certificate") {
		t.Errorf("got %s %q, want PermissionDenied before the (empty-batch) shape check", st.Code(), st.Message())
	}
	var denied *identity.DeniedError
	if errors.As(err, &denied) {
		t.Errorf("the identity error leaked as a Go error instead of a status")
	}
	_, err = f.client.GetPostRecord(testContext(t, 5*time.Second), &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "GetPostRecord: no certificate") {
		t.Errorf("GetPostRecord without a certificate: got %s %q, want PermissionDenied", st.Code(), st.Message())
	}
	// The calls above have returned, so a handler that ran has counted.
	if n := f.impl.calls.Load() - calls; n != 0 {
		t.Errorf("handlers ran %d times for refused callers, want 0", n)
	}
}
