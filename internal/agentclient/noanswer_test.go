package agentclient

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/apiclient"
)

// TestNoAnswer: a node that does not answer (refused, timed out, its agent's Unix socket
// gone) is told from an agent's error answer and from a configuration problem (neither is
// "no answer").
func TestNoAnswer(t *testing.T) {
	refused := &apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{refused, true},
		{&apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: context.DeadlineExceeded}, true},
		{&apiclient.Error{Status: 500, Kind: "internal", Msg: "cache store: no space left on device"}, false},
		{&apiclient.Error{Status: 401, Kind: "unauthorized", Msg: "bad token"}, false},
		{&AddressError{Node: "ssd1", Address: "10.0.0.2:7701"}, false},
		{&apiclient.Unreachable{Address: "unix:/run/agent.sock", Err: &net.OpError{Op: "dial", Net: "unix", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ENOENT}}}, true},
		{&apiclient.Unreachable{Address: "unix:/run/agent.sock", Err: &net.OpError{Op: "dial", Net: "unix", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EACCES}}}, false},
		{nil, false},
	} {
		if got := NoAnswer(c.err); got != c.want {
			t.Errorf("NoAnswer(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
