// Command cqlprobe asks a CQL server for its release version and prints it;
// it exits non-zero when the server does not answer within five seconds.
// scripts/cassandra.sh uses it to know when a node is ready.
//
//	go run ./scripts/cqlprobe 127.0.0.1:9042
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gocql/gocql"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cqlprobe host:port")
		os.Exit(2)
	}
	v, err := releaseVersion(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "cqlprobe:", err)
		os.Exit(1)
	}
	fmt.Println("release_version", v)
}

func releaseVersion(addr string) (string, error) {
	c := gocql.NewCluster(addr)
	c.Timeout, c.ConnectTimeout = 5*time.Second, 5*time.Second
	c.DisableInitialHostLookup = true
	c.NumConns = 1
	s, err := c.CreateSession()
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", addr, err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var v string
	if err := s.Query(`SELECT release_version FROM system.local`).WithContext(ctx).Scan(&v); err != nil {
		return "", fmt.Errorf("query %s: %w", addr, err)
	}
	return v, nil
}
