// Package netgroup says which network an address counts in for the limits that one caller
// must not escape by using many addresses: an IPv4 address's /24, an IPv6 address's /64 (one
// user, one allocation of nodes, can hold many addresses of either). The controller's
// connection limits, its MUNGE failure budget and the warpfs handshake limits all count by it.
package netgroup

import (
	"net"
	"net/netip"
)

// Of is the network of addr, given as "host:port" or as a host alone: "192.0.2.0/24",
// "2001:db8:1:2::/64" (IPv4-mapped IPv6 counts as IPv4; a zone is dropped). What is not an
// IP address is its own network.
func Of(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	bits := 64
	if ip.Is4() {
		bits = 24
	}
	prefix, _ := ip.Prefix(bits)
	return prefix.String()
}
