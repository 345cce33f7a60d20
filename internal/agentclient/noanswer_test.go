package agentclient

import (
	"context"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/apiclient"
)

// TestNoAnswer: a node whose agent is not there to answer (refused, reset, a connection
// not made in time, its Unix socket gone) is told from an agent's error answer, an agent
// that took the call and did not answer in time, and a configuration problem.
func TestNoAnswer(t *testing.T) {
	refused := &apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{refused, true},
		{&apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &timeoutError{}}}, true},
		{&apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}, true},
		// Connected, and no answer in time: the agent is there, hung.
		{&apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &url.Error{Op: "Post", URL: "http://10.0.0.2:7701/x", Err: context.DeadlineExceeded}}, false},
		{&apiclient.Unreachable{Address: "http://10.0.0.2:7701", Err: &net.OpError{Op: "read", Net: "tcp", Err: &timeoutError{}}}, false},
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

type timeoutError struct{}

func (*timeoutError) Error() string { return "i/o timeout" }
func (*timeoutError) Timeout() bool { return true }
