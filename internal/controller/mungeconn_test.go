package controller

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/mungetest"
)

// A TCP connection keeps the identity of its first MUNGE credential when that request asks
// for it (Spillway-Connection-Identity: bind), for later requests that claim it
// (Authorization: MUNGE-connection), within controller.munge_connection_lifetime: a claim on
// a connection that proved nothing, or only without asking, or too long ago, is 401 and the
// connection closed; a credential of another user on a bound connection is 401 and closed,
// never served as either user; another connection does not share the identity. An HTTP/1.0
// client keeping its connection is told the idle timeout, or told to close when its peer
// holds more than half its connection limit. Real munged, credentials made by munge as
// nobody and as uid 4242.
func TestMungeConnectionIdentity(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the credentials of two users are made by munge run as each")
	}
	const nobody, other = 65534, 4242
	const lifetime = 2 * time.Second
	a := newAdminWorld(t, func(c *config.Config) { c.Controller.MungeConnectionLifetime = config.Duration(lifetime) })
	dir, err := os.MkdirTemp("", "mungeconn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	sock := mungetest.Start(t, dir, "munged")
	a.srv.munge.socket = sock
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("nob", nobody, 0)
	a.setup("oth", other, 0)

	addr := serveTCP(t, a.srv, httpapi.Limits{MaxConnectionsPerPeer: 4, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})

	cred := func(uid uint32) string {
		t.Helper()
		cmd := exec.Command("munge", "-n", "-S", sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: nobody}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("munge -n as uid %d: %v", uid, err)
		}
		return strings.TrimSpace(string(out))
	}
	type conn struct {
		net.Conn
		br *bufio.Reader
	}
	dial := func() *conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &conn{c, bufio.NewReader(c)}
	}
	// status asks for token's status on c, with the given header lines (HTTP/1.1 unless one
	// says otherwise): the answer, its body, and whether the controller closed the connection.
	status := func(c *conn, token string, proto string, headers ...string) (*http.Response, string) {
		t.Helper()
		req := "GET /dw/v1/sessions/" + token + "/status HTTP/" + proto + "\r\nHost: x\r\n"
		for _, h := range headers {
			req += h + "\r\n"
		}
		if _, err := io.WriteString(c, req+"\r\n"); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("GET %s's status: %v", token, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	claim := "Authorization: " + controllerapi.MungeConnectionScheme
	bind := controllerapi.ConnectionIdentityHeader + ": bind"

	// A claim on a connection that proved nothing: refused, and the connection closed.
	c0 := dial()
	if resp, body := status(c0, "nob", "1.1", claim); resp.StatusCode != 401 || !resp.Close ||
		!strings.Contains(body, "munge_connection_lifetime") || !strings.Contains(body, "fresh credential") {
		t.Errorf("a claim on a new connection: %d close %v %s; want 401, closed, naming the limit and the fix", resp.StatusCode, resp.Close, body)
	}

	// nobody binds a connection: later claims on it are nobody's (their session, not uid 4242's).
	c1 := dial()
	resp, body := status(c1, "nob", "1.1", "Authorization: MUNGE "+cred(nobody), bind)
	if resp.StatusCode != 200 || resp.Header.Get(controllerapi.ConnectionIdentityHeader) != "2" || resp.Close {
		t.Fatalf("nobody's bind: %d %q close %v %s", resp.StatusCode, resp.Header.Get(controllerapi.ConnectionIdentityHeader), resp.Close, body)
	}
	if resp, body := status(c1, "nob", "1.1", claim); resp.StatusCode != 200 || !strings.Contains(body, `"exists":true`) || resp.Header.Get(controllerapi.ConnectionIdentityHeader) == "" {
		t.Errorf("nobody's claim of their own session: %d %s", resp.StatusCode, body)
	}
	if resp, body := status(c1, "oth", "1.1", claim); resp.StatusCode != 200 || !strings.Contains(body, `"exists":false`) {
		t.Errorf("nobody's claim of uid 4242's session: %d %s; want it unknown (private_data)", resp.StatusCode, body)
	}
	// Another connection does not share it.
	if resp, body := status(dial(), "nob", "1.1", claim); resp.StatusCode != 401 {
		t.Errorf("a claim on another connection: %d %s", resp.StatusCode, body)
	}
	// uid 4242's credential on nobody's connection: refused (not served as 4242, nor as
	// nobody), and the connection closed.
	resp, body = status(c1, "oth", "1.1", "Authorization: MUNGE "+cred(other), bind)
	if resp.StatusCode != 401 || !resp.Close || !strings.Contains(body, "keeps one identity") {
		t.Errorf("another user's credential on a bound connection: %d close %v %s", resp.StatusCode, resp.Close, body)
	}
	// A credential without bind binds nothing.
	c2 := dial()
	if resp, body := status(c2, "nob", "1.1", "Authorization: MUNGE "+cred(nobody)); resp.StatusCode != 200 || resp.Header.Get(controllerapi.ConnectionIdentityHeader) != "" {
		t.Errorf("a credential without bind: %d %q %s", resp.StatusCode, resp.Header.Get(controllerapi.ConnectionIdentityHeader), body)
	}
	if resp, body := status(c2, "nob", "1.1", claim); resp.StatusCode != 401 {
		t.Errorf("a claim after a credential without bind: %d %s", resp.StatusCode, body)
	}
	// The identity lasts controller.munge_connection_lifetime.
	c3 := dial()
	if resp, body := status(c3, "nob", "1.1", "Authorization: MUNGE "+cred(nobody), bind); resp.StatusCode != 200 {
		t.Fatalf("nobody's second bind: %d %s", resp.StatusCode, body)
	}
	time.Sleep(lifetime + 200*time.Millisecond)
	if resp, body := status(c3, "nob", "1.1", claim); resp.StatusCode != 401 || !resp.Close {
		t.Errorf("a claim past the lifetime: %d close %v %s", resp.StatusCode, resp.Close, body)
	}

	// HTTP/1.0 keeping its connection: told the idle timeout (1m, the default)...
	c4 := dial()
	resp, body = status(c4, "nob", "1.0", "Connection: keep-alive", "Authorization: MUNGE "+cred(nobody), bind)
	if resp.StatusCode != 200 || resp.Header.Get("Keep-Alive") != "timeout=60" || resp.Close {
		t.Errorf("an HTTP/1.0 keep-alive request: %d Keep-Alive %q close %v %s", resp.StatusCode, resp.Header.Get("Keep-Alive"), resp.Close, body)
	}
	// ... until its peer holds more than half of its connections (4 here: c4 and two more).
	dial()
	c5 := dial()
	resp, body = status(c5, "nob", "1.0", "Connection: keep-alive", "Authorization: MUNGE "+cred(nobody), bind)
	if resp.StatusCode != 200 || resp.Header.Get("Keep-Alive") != "" || !resp.Close {
		t.Errorf("an HTTP/1.0 keep-alive request of a crowded peer: %d Keep-Alive %q close %v %s", resp.StatusCode, resp.Header.Get("Keep-Alive"), resp.Close, body)
	}
}
