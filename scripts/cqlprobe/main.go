// Command cqlprobe asks CQL servers about themselves; scripts/cassandra.sh
// and scripts/cassandra-cluster.sh use it to know when nodes are ready.
//
//	cqlprobe host:port                 print the node's release version
//	cqlprobe ring N host:port…         exit 0 when every host answers and
//	                                   sees all N nodes NORMAL and alive
//
// It exits non-zero when a server does not answer within five seconds.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gocql/gocql"
)

const timeout = 5 * time.Second

func main() {
	args := os.Args[1:]
	var err error
	switch {
	case len(args) == 1:
		var v string
		if v, err = releaseVersion(args[0]); err == nil {
			fmt.Println("release_version", v)
		}
	case len(args) >= 3 && args[0] == "ring":
		var n int
		if n, err = strconv.Atoi(args[1]); err == nil {
			err = checkRing(n, args[2:])
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: cqlprobe host:port | cqlprobe ring N host:port…")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cqlprobe:", err)
		os.Exit(1)
	}
}

func session(addr string) (*gocql.Session, error) {
	c := gocql.NewCluster(addr)
	c.Timeout, c.ConnectTimeout = timeout, timeout
	c.DisableInitialHostLookup = true
	c.NumConns = 1
	s, err := c.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	return s, nil
}

func releaseVersion(addr string) (string, error) {
	s, err := session(addr)
	if err != nil {
		return "", err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var v string
	if err := s.Query(`SELECT release_version FROM system.local`).WithContext(ctx).Scan(&v); err != nil {
		return "", fmt.Errorf("query %s: %w", addr, err)
	}
	return v, nil
}

// peer is one row of a node's gossip view.
type peer struct {
	status     string
	generation int
}

// gossip returns addr's view of the cluster, keyed by node address.
func gossip(addr string) (map[string]peer, error) {
	s, err := session(addr)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	it := s.Query(`SELECT address, status_with_port, generation FROM system_views.gossip_info`).WithContext(ctx).Iter()
	view := map[string]peer{}
	var (
		a      net.IP
		status string
		gen    int
	)
	for it.Scan(&a, &status, &gen) {
		view[a.String()] = peer{status: status, generation: gen}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("gossip view of %s: %w", addr, err)
	}
	return view, nil
}

// checkRing is Cassandra's "UN" for every node, asked over CQL: each host
// answers, lists n nodes NORMAL, and has heard from each of them since its
// latest start (it knows that node's current gossip generation, which a
// node learns of itself on start and others only by hearing from it).
func checkRing(n int, hosts []string) error {
	views := map[string]map[string]peer{}
	for _, h := range hosts {
		v, err := gossip(h)
		if err != nil {
			return err
		}
		ip, _, _ := net.SplitHostPort(h)
		views[ip] = v
	}
	var errs []error
	for viewer, view := range views {
		normal := 0
		for _, p := range view {
			if strings.HasPrefix(p.status, "NORMAL") {
				normal++
			}
		}
		if normal != n {
			errs = append(errs, fmt.Errorf("%s sees %d of %d nodes NORMAL", viewer, normal, n))
		}
		for node, self := range views {
			if p := view[node]; p.generation != self[node].generation {
				errs = append(errs, fmt.Errorf("%s has not heard from %s since it started", viewer, node))
			}
		}
	}
	return errors.Join(errs...)
}
