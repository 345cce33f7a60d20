package netgroup

import "testing"

func TestOf(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.77:80":            "192.0.2.0/24",
		"127.0.0.41":               "127.0.0.0/24",
		"10.1.2.3":                 "10.1.2.0/24",
		"::ffff:10.1.2.3":          "10.1.2.0/24",
		"[::ffff:192.0.2.9]:80":    "192.0.2.0/24",
		"2001:db8:1:2:3:4:5:6":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:3::4]:80":   "2001:db8:1:2::/64",
		"[2001:db8::ffff:1]:65535": "2001:db8::/64",
		"[fe80::1%eth0]:1":         "fe80::/64",
		"fe80::1%eth0":             "fe80::/64",
		"[::1]:1":                  "::/64",
		"@":                        "@",
		"not an address":           "not an address",
	} {
		if got := Of(addr); got != want {
			t.Errorf("Of(%q) = %q, want %q", addr, got, want)
		}
	}
}
