package munge

// munged's client protocol, spoken as libmunge speaks it (written from the format, not from
// munge's code). One request and one answer per connection to munged's Unix socket; munged
// closes it after answering. Integers are big-endian.
//
//	header (11 bytes): magic u32 0x00606D4B, version u8 4, type u8, retry u8, body length u32
//	ENC_REQ (2): cipher u8, mac u8, zip u8, realm_len u8, realm, ttl u32, auth_uid u32,
//	             auth_gid u32, data_len u32, data (the payload)
//	ENC_RSP (3): error u8, msg_len u8, msg, data_len u32, data (the credential, NUL-ended)
//	DEC_REQ (4): data_len u32, data (the credential, NUL-ended)
//	DEC_RSP (5): error u8, msg_len u8, msg, cipher u8, mac u8, zip u8, realm_len u8, realm,
//	             ttl u32, addr_len u8, addr, time0 u32, time1 u32, cred_uid u32, cred_gid u32,
//	             auth_uid u32, auth_gid u32, data_len u32, data (the payload)
//
// Message version 4 is every munge since 0.5 (2006) up to today's. munged learns who the
// client is from the kernel: SO_PEERCRED on Linux (Debian's munge 0.5.15 is built with it),
// so the client sends nothing more. Only where the kernel has no peer-credential call does
// munged instead answer a request with AUTH_FD_REQ (6), a file-descriptor-passing handshake
// (STREAMS I_SENDFD), which is not spoken here: such an answer is an error naming it.
//
// libmunge retries a failed exchange up to 5 times with the header's retry count raised, and
// munged then lets a replayed credential through (the first try's may have been decoded with
// its answer lost). Spillway does not retry: the controller decodes credentials that come from
// the network, and a retry could pass a replay; a failed exchange is ErrUnavailable (503) and
// the caller retries with a fresh credential. Nor does it retry a refused connect
// (libmunge's answer to a full listen queue of 256): at most controller.max_munge_decodes
// connect at once.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// DefaultSocket is munged's socket when none is configured (munge's own default).
const DefaultSocket = "/run/munge/munge.socket.2"

const (
	msgMagic   = 0x00606D4B
	msgVersion = 4
	headerSize = 11

	msgEncReq    = 2
	msgEncRsp    = 3
	msgDecReq    = 4
	msgDecRsp    = 5
	msgAuthFDReq = 6
)

// Protocol bounds, not tunables:
const (
	// exchangeTimeout bounds one exchange with munged when ctx sets no earlier deadline:
	// libmunge's own bound (MUNGE_SOCKET_TIMEOUT_MSECS), which unmunge kept before.
	exchangeTimeout = 2 * time.Second
	// maxAnswer bounds an answer's body. munged takes requests of at most 1 MiB
	// (MUNGE_MAXIMUM_REQ_LEN), which bounds a credential's payload, hence a decode's answer
	// (the payload and at most ~600 bytes of fields). A longer one is not munged's: refused
	// before reading it. A payload is skipped, never held (Spillway's clients send none).
	maxAnswer = 1<<20 + 4096
)

// cipher, mac and zip as munged's defaults (MUNGE_*_DEFAULT); ttl 0 = munged's default;
// auth uid and gid "any" (MUNGE_UID_ANY): what `munge -n` asks for.
const (
	dflt   = 1
	anyID  = 0xFFFFFFFF
	noTTL  = 0
	noData = 0
)

// encodeRequest is an ENC_REQ with no payload, munged's defaults.
func encodeRequest() []byte {
	body := []byte{dflt, dflt, dflt, 0} // cipher, mac, zip, no realm
	body = binary.BigEndian.AppendUint32(body, noTTL)
	body = binary.BigEndian.AppendUint32(body, anyID)
	body = binary.BigEndian.AppendUint32(body, anyID)
	body = binary.BigEndian.AppendUint32(body, noData)
	return frame(msgEncReq, body)
}

// decodeRequest is a DEC_REQ of cred, NUL-ended as libmunge sends it.
func decodeRequest(cred string) []byte {
	body := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(cred)+1), uint32(len(cred)+1))
	body = append(append(body, cred...), 0)
	return frame(msgDecReq, body)
}

func frame(typ byte, body []byte) []byte {
	m := binary.BigEndian.AppendUint32(make([]byte, 0, headerSize+len(body)), msgMagic)
	m = append(m, msgVersion, typ, 0) // retry 0: a first try (never another: see above)
	m = binary.BigEndian.AppendUint32(m, uint32(len(body)))
	return append(m, body...)
}

// exchange sends req to munged at socket and reads its answer, which must be of type want,
// with read; within ctx and exchangeTimeout. Every failure here is munged's (or the socket's),
// not a judgement on a credential: it matches ErrUnavailable.
func exchange(ctx context.Context, socket string, req []byte, want byte, read func(*answer)) error {
	if socket == "" {
		socket = DefaultSocket
	}
	start := time.Now()
	deadline := start.Add(exchangeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", socket)
	if err != nil {
		return unavailable{fmt.Errorf("cannot reach munged at %s: %v (is it running? munge_socket names its socket)", socket, cause(err))}
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	// A cancelled ctx (the caller gone) ends the exchange at once.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(what string, err error) error {
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			why := ctx.Err()
			if why == nil {
				why = context.DeadlineExceeded
			}
			return unavailable{fmt.Errorf("munged at %s did not answer within %v (%s): %w", socket,
				deadline.Sub(start).Round(time.Millisecond), what, why)}
		}
		return unavailable{fmt.Errorf("munged at %s: %s: %v", socket, what, cause(err))}
	}
	if _, err := conn.Write(req); err != nil {
		return fail("sending the request", err)
	}
	var hdr [headerSize]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fail("reading the answer's header", err)
	}
	magic, version, typ, size := binary.BigEndian.Uint32(hdr[0:]), hdr[4], hdr[5], binary.BigEndian.Uint32(hdr[7:])
	switch {
	case magic != msgMagic:
		return fail("answer", fmt.Errorf("not munged's protocol (magic %#x, want %#x)", magic, msgMagic))
	case version != msgVersion:
		return fail("answer", fmt.Errorf("MUNGE message version %d, Spillway speaks %d (every munge since 0.5)", version, msgVersion))
	case typ == msgAuthFDReq:
		return fail("answer", errors.New("munged asks for its file-descriptor-passing authentication (a platform without SO_PEERCRED), which Spillway does not speak"))
	case typ != want:
		return fail("answer", fmt.Errorf("message type %d, want %d", typ, want))
	case size > maxAnswer:
		return fail("answer", fmt.Errorf("a body of %d bytes, more than munged sends (%d)", size, maxAnswer))
	}
	a := &answer{r: bufio.NewReaderSize(io.LimitReader(conn, int64(size)), 512), left: size}
	read(a)
	if a.err == nil && a.left != 0 {
		a.err = fmt.Errorf("%d bytes past the answer's last field", a.left)
	}
	if a.err != nil {
		return fail("reading the answer", a.err)
	}
	return nil
}

// cause strips net's wrapping ("dial unix /x: connect: ...") down to the system's reason.
func cause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("munged closed the connection before its whole answer")
	}
	return err
}

// answer reads an answer's body field by field; the first failure sticks and later reads
// return zeros.
type answer struct {
	r    *bufio.Reader
	left uint32 // body bytes not read yet
	err  error
}

func (a *answer) take(n uint32) bool {
	if a.err != nil {
		return false
	}
	if n > a.left {
		a.err = fmt.Errorf("a field of %d bytes past the body's end (%d left)", n, a.left)
		return false
	}
	a.left -= n
	return true
}

func (a *answer) u8() byte {
	if !a.take(1) {
		return 0
	}
	b, err := a.r.ReadByte()
	if err != nil {
		a.err = err
	}
	return b
}

func (a *answer) u32() uint32 {
	var b [4]byte
	if !a.take(4) {
		return 0
	}
	if _, err := io.ReadFull(a.r, b[:]); err != nil {
		a.err = err
		return 0
	}
	return binary.BigEndian.Uint32(b[:])
}

// bytes reads n bytes; n is bounded by the caller.
func (a *answer) bytes(n uint32) []byte {
	if n == 0 || !a.take(n) {
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(a.r, b); err != nil {
		a.err = err
		return nil
	}
	return b
}

// skip passes n bytes without holding them.
func (a *answer) skip(n uint32) {
	if n == 0 || !a.take(n) {
		return
	}
	if _, err := a.r.Discard(int(n)); err != nil {
		a.err = err
	}
}

// text reads a u8 length and that many bytes of a NUL-ended string (munged's messages and
// realms), kept printable.
func (a *answer) text() string {
	b := a.bytes(uint32(a.u8()))
	s, _, _ := strings.Cut(string(b), "\x00")
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// munged's answers: its error code (munge_err_t, 0 = success) and message.
type verdict struct {
	code byte
	msg  string
}

// decodeAnswer reads a DEC_RSP: the verdict and the identity it names (meaningful only on
// success). The payload is skipped.
func decodeAnswer(a *answer) (verdict, Identity) {
	v := verdict{code: a.u8(), msg: a.text()}
	a.u8()                  // cipher
	a.u8()                  // mac
	a.u8()                  // zip
	a.text()                // realm
	a.u32()                 // ttl
	if n := a.u8(); n > 4 { // an IPv4 address: munge's own parser refuses more
		if a.err == nil {
			a.err = fmt.Errorf("an address of %d bytes", n)
		}
	} else {
		a.skip(uint32(n))
	}
	a.u32() // time0: encoded
	a.u32() // time1: decoded
	id := Identity{UID: a.u32(), GID: a.u32()}
	a.u32() // auth uid
	a.u32() // auth gid
	n := a.u32()
	if a.err == nil && n != a.left {
		a.err = fmt.Errorf("a payload of %d bytes in a body with %d left", n, a.left)
	}
	a.skip(n)
	return v, id
}

// encodeAnswer reads an ENC_RSP: the verdict and the credential.
func encodeAnswer(a *answer) (verdict, string) {
	v := verdict{code: a.u8(), msg: a.text()}
	n := a.u32()
	if a.err == nil && n > maxCredential+1 {
		a.err = fmt.Errorf("a credential of %d bytes (one without payload is ~150)", n)
		return v, ""
	}
	cred, _, _ := strings.Cut(string(a.bytes(n)), "\x00")
	return v, cred
}
