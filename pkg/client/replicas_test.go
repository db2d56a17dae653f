package client_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app/apptest"
	"github.com/sluice-dev/sluice/pkg/client"
)

// Tests that DialReplicas sends no call to a replica whose health service
// reports NOT_SERVING (one draining, or starting and not caught up yet)
// while another serves, though that replica still accepts connections.
func TestReplicasSkipOneNotServing(t *testing.T) {
	serving := apptest.Start(t, apptest.Options{Posts: 100})
	notServing := apptest.Start(t, apptest.Options{Posts: 100})
	for _, s := range []*apptest.Server{serving, notServing} {
		waitReady(t, s.AdminURL)
	}
	notServing.App.Guard.SetServing(false)
	c, err := client.DialReplicas(testCtx(t), []string{serving.GRPCAddr, notServing.GRPCAddr}, "health")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 40 {
		if _, err := c.GetPostRecords(testCtx(t), serving.URIs[:5]); err != nil {
			t.Fatal(err)
		}
	}
	calls := func(s *apptest.Server) float64 {
		return s.Metrics().Sum("sluice_requests_total", map[string]string{"method": "GetPostRecords"})
	}
	if n := calls(notServing); n != 0 {
		t.Errorf("%v calls reached the replica reporting NOT_SERVING, want 0", n)
	}
	if n := calls(serving); n < 40 {
		t.Errorf("%v calls reached the serving replica, want all 40", n)
	}
}

// waitReady waits until the admin server at adminURL answers /readyz.
func waitReady(t *testing.T, adminURL string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(adminURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz not ready within 30s", adminURL)
		}
	}
}
