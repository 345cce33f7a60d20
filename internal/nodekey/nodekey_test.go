package nodekey

import (
	"strings"
	"testing"
)

func TestCredentials(t *testing.T) {
	cred := Derive("cluster-secret", "cn1")
	if node, ok := Verify("cluster-secret", cred); !ok || node != "cn1" {
		t.Fatalf("Verify(own credential) = %q %v", node, ok)
	}
	forged := strings.Replace(cred, "node:cn1:", "node:ssd1:", 1)
	if _, ok := Verify("cluster-secret", forged); ok {
		t.Error("a credential renamed to another node verified")
	}
	if _, ok := Verify("other-secret", cred); ok {
		t.Error("a credential verified under another secret")
	}
	if _, ok := Verify("cluster-secret", "cluster-secret"); ok {
		t.Error("the secret itself verified as a node credential")
	}
	if For(cred, "cn1") != cred || For("cluster-secret", "cn1") != cred {
		t.Error("For must give the node's credential from either the credential or the secret")
	}
	if node, ok := Node("node:a:b:c:ff"); !ok || node != "a:b:c" {
		t.Errorf("Node of a name with colons: %q %v", node, ok)
	}
}

func TestCapabilities(t *testing.T) {
	c := Capability{Fragment: 1, Namespace: 2, Instance: 3, Client: "cn:1", ReadOnly: true, MaxFileSize: 10, Expires: 99, Stripes: true}
	back, err := ParseCapability(c.String())
	if err != nil || back != c {
		t.Fatalf("ParseCapability(%q) = %+v %v", c.String(), back, err)
	}
	for _, bad := range []string{"", "cap1:1:2:3", "cap1:1:2:3:0:0:0:x", "cap2:1:2:3:0:0:0:x", "cap2:a:2:3:0:0:0:0:x"} {
		if _, err := ParseCapability(bad); err == nil {
			t.Errorf("ParseCapability(%q) accepted", bad)
		}
	}
	storage := Derive("s", "ssd1")
	k := SessionKey(storage, c.String())
	c2, c3 := c, c
	c2.Namespace = 5
	c3.Stripes = false
	if SessionKey(storage, c2.String()) == k || SessionKey(storage, c3.String()) == k || SessionKey(Derive("s", "ssd2"), c.String()) == k {
		t.Error("the session key must change with the capability and the storage node")
	}
}
