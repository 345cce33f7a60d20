// Package nodekey gives each node of a cluster its own credential, and each mount a
// capability, so that no node holds a secret that grants more than its own part.
//
// The controller holds the cluster's secret (controller.token_file). A node's credential is
// "node:<name>:<hex HMAC-SHA256(secret, name)>": the controller can compute it for any node,
// the node holds only its own (agent.token_file), and with it the node can do what a node
// does (heartbeat for itself, be called by the controller) and nothing an administrator does.
//
// A mount of a namespace held by another node needs a capability: the namespace, fragment and
// instance, the client node, read-only, the maximum file size, and an expiry, issued by the
// controller with a session key HMAC(storage node's credential, capability). The compute node
// proves the session key in the warpfs handshake without sending it; the storage node, which
// holds its own credential, computes the same key. So a compute node can open only the
// namespaces the controller gave it a capability for, and only until it expires.
package nodekey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

const credentialPrefix = "node:"

// Derive is node's credential under the cluster's secret.
func Derive(secret, node string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("spillway node credential\x00" + node))
	return credentialPrefix + node + ":" + hex.EncodeToString(mac.Sum(nil))
}

// Node is the node a credential names, if token is a node credential (not the secret).
func Node(token string) (string, bool) {
	rest, ok := strings.CutPrefix(token, credentialPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// For is the credential node uses, given the token this process holds: its own credential as
// it is, or derived when the process holds the cluster's secret.
func For(token, node string) string {
	if _, isNode := Node(token); isNode {
		return token
	}
	return Derive(token, node)
}

// Verify reports which node presented cred, if the secret made it.
func Verify(secret, cred string) (string, bool) {
	node, ok := Node(cred)
	if !ok || secret == "" {
		return "", false
	}
	return node, hmac.Equal([]byte(Derive(secret, node)), []byte(cred))
}

// Capability is the right of one client node to mount one namespace.
type Capability struct {
	Fragment, Namespace, Instance int64
	Client                        string // the client node's name
	ReadOnly                      bool
	MaxFileSize                   uint64
	Expires                       int64 // Unix seconds
	// Stripes grants the fragment's stripe objects (a striped instance's file data), not a
	// namespace.
	Stripes bool
}

// String is the capability's canonical text, which the session key signs.
func (c Capability) String() string {
	ro := 0
	if c.ReadOnly {
		ro = 1
	}
	stripes := 0
	if c.Stripes {
		stripes = 1
	}
	return fmt.Sprintf("cap2:%d:%d:%d:%d:%d:%d:%d:%s", c.Fragment, c.Namespace, c.Instance, ro, c.MaxFileSize, c.Expires, stripes, c.Client)
}

// ParseCapability reads String's text.
func ParseCapability(s string) (Capability, error) {
	parts := strings.SplitN(s, ":", 9)
	if len(parts) != 9 || parts[0] != "cap2" {
		return Capability{}, fmt.Errorf("not a capability")
	}
	var n [7]int64
	for i := range n {
		v, err := strconv.ParseInt(parts[i+1], 10, 64)
		if err != nil {
			return Capability{}, fmt.Errorf("capability field %d: %v", i+1, err)
		}
		n[i] = v
	}
	return Capability{Fragment: n[0], Namespace: n[1], Instance: n[2], ReadOnly: n[3] == 1,
		MaxFileSize: uint64(n[4]), Expires: n[5], Stripes: n[6] == 1, Client: parts[8]}, nil
}

// SessionKey is the key a capability's holder proves: only the controller (which can derive
// every node's credential) and the storage node (which holds its own) can compute it.
func SessionKey(storageCredential, capability string) string {
	mac := hmac.New(sha256.New, []byte(storageCredential))
	mac.Write([]byte("spillway capability\x00" + capability))
	return hex.EncodeToString(mac.Sum(nil))
}
