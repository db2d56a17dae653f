package cqlstore

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/gocql/gocql"
)

// parseAddressMap reads "advertised=reachable,…" pairs of ip:port.
func parseAddressMap(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, pair := range splitList(s) {
		from, to, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not advertised=reachable (for example 10.0.0.5:9042=127.0.0.1:19042)", pair)
		}
		m[strings.TrimSpace(from)] = strings.TrimSpace(to)
	}
	return m, nil
}

// addressTranslator returns the driver's translator for AddressMap, nil
// when the map is empty, or an error naming each entry that is not a
// pair of ip:port.
func (c Config) addressTranslator() (gocql.AddressTranslator, error) {
	if len(c.AddressMap) == 0 {
		return nil, nil
	}
	table := make(map[netip.AddrPort]netip.AddrPort, len(c.AddressMap))
	var errs []error
	for from, to := range c.AddressMap {
		advertised, err1 := netip.ParseAddrPort(from)
		reachable, err2 := netip.ParseAddrPort(to)
		if err := errors.Join(err1, err2); err != nil {
			errs = append(errs, fmt.Errorf("cql: address map %s=%s: both sides must be ip:port: %w", from, to, err))
			continue
		}
		table[unmapped(advertised)] = reachable
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return gocql.AddressTranslatorFunc(func(ip net.IP, port int) (net.IP, int) {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok || port < 0 || port > 65535 {
			return ip, port
		}
		to, ok := table[unmapped(netip.AddrPortFrom(addr, uint16(port)))]
		if !ok {
			return ip, port
		}
		return net.IP(to.Addr().AsSlice()), int(to.Port())
	}), nil
}

// unmapped folds an IPv4-in-IPv6 address to IPv4, as the driver may hand
// either form.
func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
