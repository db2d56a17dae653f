package cqlstore

import (
	"context"
	"net"
	"strconv"
)

// Acquire lets the external tests hold query slots.
func (s *Store) Acquire(ctx context.Context) (release func(), err error) { return s.acquire(ctx) }

// Translate is the address the driver dials for a node advertising addr.
func (c Config) Translate(addr string) (string, error) {
	t, err := c.addressTranslator()
	if err != nil || t == nil {
		return addr, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, _ := strconv.Atoi(port)
	ip, p := t.Translate(net.ParseIP(host), p)
	return net.JoinHostPort(ip.String(), strconv.Itoa(p)), nil
}
