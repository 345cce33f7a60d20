package munge

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/mungetest"
)

// twoHosts runs two munged with one key, the controller's host's and a user's host's, in a
// directory every user may reach (nobody makes credentials there).
func twoHosts(t *testing.T) (dir, controller, node string) {
	t.Helper()
	dir = t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, mungetest.Start(t, dir, "controller"), mungetest.Start(t, dir, "node")
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes credentials as nobody")
	}
}

// mungeAs runs `munge -n` (munge's own client, libmunge) as uid:gid with args.
func mungeAs(t *testing.T, uid, gid int, args ...string) string {
	t.Helper()
	cmd := exec.Command("munge", append([]string{"-n"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("munge %v as %d: %v", args, uid, err)
	}
	return strings.TrimSpace(string(out))
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Decode speaks munged's protocol: a credential libmunge made for nobody on another host
// names nobody, with or without a payload (ignored); one Encode made (as root, here) is
// munge's own (unmunge decodes it) and names root.
func TestDecodeNamesTheCredentialsUser(t *testing.T) {
	requireRoot(t)
	_, controller, node := twoHosts(t)
	ctx := ctxFor(t, 30*time.Second)
	for _, args := range [][]string{{"-S", node}, {"-S", node, "-s", "a payload munge carries"}} {
		id, err := Decode(ctx, controller, mungeAs(t, 65534, 65534, args...))
		if err != nil || id != (Identity{65534, 65534}) {
			t.Errorf("nobody's credential (munge %v): %+v %v", args, id, err)
		}
	}
	id, err := Decode(ctx, controller, mungeAs(t, 4242, 4343, "-S", node))
	if err != nil || id != (Identity{4242, 4343}) {
		t.Errorf("uid 4242 gid 4343's credential: %+v %v", id, err)
	}

	cred, err := Encode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if err := WellFormed(cred); err != nil {
		t.Fatalf("Encode made %q: %v", cred, err)
	}
	cmd := exec.Command("unmunge", "-S", controller, "-N", "-k", "UID,GID", "-o", "/dev/null")
	cmd.Stdin = strings.NewReader(cred)
	out, err := cmd.Output()
	if err != nil || !regexp.MustCompile(`(?m)^UID:\s+0\nGID:\s+0$`).Match(out) {
		t.Errorf("unmunge of Encode's credential: %v %s", err, out)
	}
	cred, _ = Encode(ctx, node)
	if id, err := Decode(ctx, controller, cred); err != nil || id != (Identity{0, 0}) {
		t.Errorf("Encode then Decode as root: %+v %v", id, err)
	}
}

// What munged refuses is refused with its reason and its code, as a judgement on the
// credential (not ErrUnavailable): a replay, a credential of another key, an expired one,
// forged or damaged ones.
func TestDecodeRefusesWithMungesReason(t *testing.T) {
	dir, controller, node := twoHosts(t)
	other := mungetest.Start(t, t.TempDir(), "other-cluster")
	ctx := ctxFor(t, 30*time.Second)
	fresh := func(sock string, args ...string) string {
		t.Helper()
		out, err := exec.Command("munge", append([]string{"-n", "-S", sock}, args...)...).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	expiring := fresh(node, "-t", "1")
	expiringAt := time.Now()

	replayed := fresh(node)
	if _, err := Decode(ctx, controller, replayed); err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 102)
	rand.Read(random)
	good := fresh(node)
	body := strings.TrimSuffix(strings.TrimPrefix(good, "MUNGE:"), ":")
	flipped := []byte(body)
	// Another base64 letter in the middle (a bit flipped could leave the alphabet, '+' to '*',
	// which never reaches munged): a MAC that does not match.
	if mid := len(flipped) / 2; flipped[mid] == 'A' {
		flipped[mid] = 'B'
	} else {
		flipped[mid] = 'A'
	}

	cases := []struct {
		name, cred string
		code       int
		says       string
	}{
		{"a replay", replayed, 17, "Replayed credential"},
		{"another key's", fresh(other), 14, "another key"},
		{"forged", "MUNGE:" + base64.StdEncoding.EncodeToString(random) + ":", 0, ""},
		{"truncated", "MUNGE:" + body[:len(body)-8] + ":", 0, ""},
		{"altered", "MUNGE:" + string(flipped) + ":", 0, ""},
	}
	check := func(name, cred string, code int, says string) {
		t.Helper()
		id, err := Decode(ctx, controller, cred)
		var r *Refusal
		switch {
		case err == nil:
			t.Errorf("%s credential accepted: %+v", name, id)
		case errors.Is(err, ErrUnavailable) || !errors.As(err, &r):
			t.Errorf("%s credential: not a refusal: %v", name, err)
		case code != 0 && r.Code != code, says != "" && !strings.Contains(err.Error(), says),
			!strings.HasPrefix(err.Error(), "MUNGE credential refused: "):
			t.Errorf("%s credential: %v (code %d), want code %d saying %q", name, err, r.Code, code, says)
		case id != Identity{}:
			t.Errorf("%s credential: refused, yet names %+v", name, id)
		}
	}
	for _, c := range cases {
		check(c.name, c.cred, c.code, c.says)
	}
	time.Sleep(time.Until(expiringAt.Add(2500 * time.Millisecond)))
	check("an expired", expiring, 15, "Expired credential")
	_ = dir
}

// munged not running, its socket stale (munged killed), or no socket at the path: the
// credential is not judged (ErrUnavailable), at once.
func TestMungedDownIsUnavailable(t *testing.T) {
	dir, controller, node := twoHosts(t)
	ctx := ctxFor(t, 30*time.Second)
	cred, err := Encode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := os.ReadFile(filepath.Join(dir, "controller.pid"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(n, 0) == nil { // the test's own child: a zombie until mungetest reaps it
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(n) + "/stat"); strings.Contains(string(b), ") Z ") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	file := filepath.Join(dir, "not-a-socket")
	os.WriteFile(file, nil, 0o644)
	for _, sock := range []string{controller, filepath.Join(dir, "none.sock"), file} {
		start := time.Now()
		_, err := Decode(ctx, sock, cred)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "munged at "+sock) || !strings.HasPrefix(err.Error(), "MUNGE credential not checked") {
			t.Errorf("decode at %s: %v, want ErrUnavailable naming the socket", sock, err)
		}
		var r *Refusal
		if errors.As(err, &r) {
			t.Errorf("decode at %s: a refusal: %v", sock, err)
		}
		if _, err := Encode(ctx, sock); !errors.Is(err, ErrUnavailable) {
			t.Errorf("encode at %s: %v, want ErrUnavailable", sock, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("at %s: %v to fail", sock, d)
		}
	}
}

// A server on munged's socket that is not munged, or a munged gone wrong: a clear error
// (ErrUnavailable: it is not a verdict), within the ctx's deadline, memory bounded whatever
// lengths it announces; a payload is skipped, never held.
func TestMisbehavingMungedIsBounded(t *testing.T) {
	cred := "MUNGE:" + base64.StdEncoding.EncodeToString(make([]byte, 102)) + ":"
	header := func(version, typ byte, size uint32) []byte {
		h := binary.BigEndian.AppendUint32(nil, msgMagic)
		h = append(h, version, typ, 0)
		return binary.BigEndian.AppendUint32(h, size)
	}
	// A DEC_RSP body: code, message, then the fields, uid and gid, and a payload of n bytes.
	decRsp := func(code byte, msg string, uid uint32, payload uint32) []byte {
		b := []byte{code, byte(len(msg) + 1)}
		b = append(append(b, msg...), 0)
		b = append(b, 4, 5, 0, 0)                   // cipher, mac, zip, no realm
		b = binary.BigEndian.AppendUint32(b, 300)   // ttl
		b = append(b, 4, 127, 0, 0, 1)              // addr
		b = binary.BigEndian.AppendUint32(b, 1)     // time0
		b = binary.BigEndian.AppendUint32(b, 2)     // time1
		b = binary.BigEndian.AppendUint32(b, uid)   // uid
		b = binary.BigEndian.AppendUint32(b, uid)   // gid
		b = binary.BigEndian.AppendUint32(b, anyID) // auth uid
		b = binary.BigEndian.AppendUint32(b, anyID) // auth gid
		return binary.BigEndian.AppendUint32(b, payload)
	}
	ok := decRsp(0, "Success", 1234, 0)
	cases := []struct {
		name   string
		answer func(c net.Conn)
		says   string // "" = decodes as uid 1234
		refuse int    // a Refusal with this code
	}{
		{"a huge length", func(c net.Conn) {
			c.Write(header(4, msgDecRsp, 0xFFFFFFF0))
			io.Copy(c, io.LimitReader(zeroes{}, 64<<20))
		}, "more than munged sends", 0},
		{"garbage", func(c net.Conn) {
			b := make([]byte, 4096)
			rand.Read(b)
			c.Write(b)
		}, "not munged's protocol", 0},
		{"another version", func(c net.Conn) { c.Write(append(header(3, msgDecRsp, uint32(len(ok))), ok...)) }, "message version 3", 0},
		{"fd-passing authentication", func(c net.Conn) { c.Write(header(4, msgAuthFDReq, 10)) }, "file-descriptor-passing", 0},
		{"another type", func(c net.Conn) { c.Write(append(header(4, msgEncRsp, uint32(len(ok))), ok...)) }, "message type 3", 0},
		{"silence", func(c net.Conn) { time.Sleep(3 * time.Second) }, "did not answer within", 0},
		{"a header, then silence", func(c net.Conn) { c.Write(header(4, msgDecRsp, 200)); time.Sleep(3 * time.Second) }, "did not answer within", 0},
		{"a body cut short", func(c net.Conn) { c.Write(append(header(4, msgDecRsp, uint32(len(ok))), ok[:20]...)) }, "closed the connection", 0},
		{"a payload longer than the body", func(c net.Conn) {
			b := decRsp(0, "Success", 1234, 1<<20)
			c.Write(append(header(4, msgDecRsp, uint32(len(b))), b...))
		}, "payload of 1048576 bytes", 0},
		{"an address too long", func(c net.Conn) {
			b := decRsp(0, "Success", 1234, 0)
			b[2+8+4+4] = 200
			c.Write(append(header(4, msgDecRsp, uint32(len(b))), b...))
		}, "address of 200 bytes", 0},
		{"bytes past the fields", func(c net.Conn) {
			b := append(decRsp(0, "Success", 1234, 0), 1, 2, 3)
			c.Write(append(header(4, msgDecRsp, uint32(len(b))), b...))
		}, "payload of 0 bytes in a body with 3 left", 0},
		{"a refusal naming a uid", func(c net.Conn) {
			b := decRsp(15, "Expired credential", 0, 0)
			c.Write(append(header(4, msgDecRsp, uint32(len(b))), b...))
		}, "Expired credential", 15},
		{"munged's own failure", func(c net.Conn) {
			b := decRsp(6, "Failed to determine client identity", 0, 0)
			c.Write(append(header(4, msgDecRsp, uint32(len(b))), b...))
		}, "Failed to determine client identity", 0},
		{"a 1 MiB payload", func(c net.Conn) {
			b := decRsp(0, "Success", 1234, 1<<20)
			c.Write(append(header(4, msgDecRsp, uint32(len(b))+1<<20), b...))
			io.Copy(c, io.LimitReader(zeroes{}, 1<<20))
		}, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "munge.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := make(chan []byte, 1)
			go func() {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				req := make([]byte, headerSize+4+len(cred)+1)
				io.ReadFull(conn, req)
				got <- req
				c.answer(conn)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			id, err := Decode(ctx, sock, cred)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if took > 1500*time.Millisecond {
				t.Errorf("took %v with a deadline of 500ms", took)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<10 {
				t.Errorf("allocated %d bytes", alloc)
			}
			if req := <-got; string(req) != string(decodeRequest(cred)) {
				t.Errorf("the request: %q", req)
			}
			var r *Refusal
			switch {
			case c.says == "":
				if err != nil || id != (Identity{1234, 1234}) {
					t.Errorf("%+v %v, want uid 1234", id, err)
				}
			case c.refuse != 0:
				if !errors.As(err, &r) || r.Code != c.refuse || !strings.Contains(err.Error(), c.says) || errors.Is(err, ErrUnavailable) {
					t.Errorf("%v, want a refusal %d saying %q", err, c.refuse, c.says)
				}
			default:
				if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), c.says) || errors.As(err, &r) {
					t.Errorf("%v, want ErrUnavailable saying %q", err, c.says)
				}
			}
			if c.says != "" && id != (Identity{}) {
				t.Errorf("refused, yet names %+v", id)
			}
		})
	}
}

type zeroes struct{}

func (zeroes) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// The cost of a decode: munged's protocol against an unmunge process per credential (the old
// way). go test -run X -bench Decode ./internal/munge/
func BenchmarkDecode(b *testing.B) {
	dir := b.TempDir()
	sock := mungetest.Start(b, dir, "munged")
	ctx := context.Background()
	creds := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			c, err := Encode(ctx, sock)
			if err != nil {
				b.Fatal(err)
			}
			out[i] = c
		}
		return out
	}
	b.Run("protocol", func(b *testing.B) {
		cs := creds(b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := Decode(ctx, sock, cs[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmunge-process", func(b *testing.B) {
		cs := creds(b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cmd := exec.CommandContext(ctx, "unmunge", "-N", "-k", "UID,GID", "-o", "/dev/null", "-S", sock)
			cmd.Stdin = strings.NewReader(cs[i])
			if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "UID:") {
				b.Fatal(err, string(out))
			}
		}
	})
	b.Run("encode-protocol", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := Encode(ctx, sock); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode-munge-process", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := exec.CommandContext(ctx, "munge", "-n", "-S", sock).Output(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
