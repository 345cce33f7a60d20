package proto

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// samples holds one filled message of every type, by the op it belongs to.
func samples() []struct {
	op    Op
	reply bool
	m     Message
} {
	attr := Attr{Ino: 7, Size: 1 << 40, Blocks: 9, Atime: Timespec{-1, 999999999}, Mtime: Timespec{2, 3},
		Ctime: Timespec{4, 5}, Mode: 0o100644, Nlink: 2, UID: 65534, GID: 100, Rdev: 3, Blksize: 4096}
	return []struct {
		op    Op
		reply bool
		m     Message
	}{
		{OpHello, false, &Hello{Magic: Magic, MinVersion: 1, MaxVersion: 3, Nonce: [16]byte{1, 2, 3}}},
		{OpHello, true, &Challenge{Version: 1, Nonce: [32]byte{9, 8}}},
		{OpAuth, false, &Auth{Proof: [32]byte{5}, Client: "nid00017", Fragment: 3, Namespace: 4, Instance: 5, ReadOnly: true, MaxFileSize: 1 << 30}},
		{OpAuth, true, &Welcome{Proof: [32]byte{6}, MaxIO: MaxIO, Root: attr}},
		{OpLookup, false, &PathReq{Path: "a/b/c"}},
		{OpLookup, true, &AttrReply{Attr: attr}},
		{OpMkdir, true, &AttrReply{Attr: attr, Dir: &attr}},
		{OpGetattr, false, &NodeReq{Path: "x", Handle: 12}},
		{OpSetattr, false, &SetattrReq{Path: "p", Handle: 1, Valid: SetSize | SetMtime, Mode: 0o600, UID: 1, GID: 2, Size: 77, Atime: Timespec{1, 2}, Mtime: Timespec{3, 4}}},
		{OpOpen, false, &OpenReq{Path: "f", Flags: 0o2}},
		{OpOpen, true, &OpenReply{Handle: 99, Attr: attr, Layout: []byte{1, 2, 3}, Truncated: true}},
		{OpOpen, true, &OpenReply{Handle: 99, Attr: attr, Layout: []byte{1, 2, 3}, Cache: &CacheRef{Path: "d/f", Dev: 1 << 40, Ino: 77}}},
		{OpCreate, true, &OpenReply{Handle: 99, Attr: attr, Layout: []byte{1}, Dir: &attr}},
		{OpCreate, true, &OpenReply{Handle: 99, Attr: attr, Layout: []byte{1}, Cache: &CacheRef{Path: "d/f", Dev: 1 << 40, Ino: 77}, Dir: &attr}},
		{OpOpen, false, &OpenReq{Path: "00000000000000ff", Flags: 2, Cache: &CacheRef{Path: "f", Dev: 3, Ino: 4}}},
		{OpOpen, false, &OpenReq{Path: "00000000000000ff", Flags: 2, Cache: &CacheRef{Path: "f", Dev: 3, Ino: 4,
			Policy: CachePolicy{Set: PolicySyncOnClose | PolicyReadAhead, ReadAhead: 1 << 20, SyncOnClose: true, Gen: 42}}}},
		{OpCreate, false, &CreateReq{Name: "00000000000000ff", Flags: 0o102, Mode: 0o600, Cache: &CacheRef{Path: "a/b", Dev: 5, Ino: 6}}},
		{OpUnlink, false, &EntryReq{Name: "00000000000000ff", Cache: &CacheRef{Path: "a/b", Dev: 5, Ino: 6}}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4, 5}, Cache: &CacheRef{Path: "x", Dev: 7, Ino: 8}}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4, 5}}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4, 5}, ObjectsKnown: true, Objects: []byte{0b1010}}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4, 5}, ObjectsKnown: true, Objects: []byte{0b1010}, Dir: &attr}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4, 5}, Cache: &CacheRef{Path: "x", Dev: 7, Ino: 8}, Dir: &attr}},
		{OpUnlink, true, &RemovedReply{Layout: []byte{4}, Dir: &attr}},
		{OpCreate, false, &CreateReq{Dir: "d", Name: "n", Flags: 0o101, Mode: 0o644}},
		{OpMkdir, false, &MkdirReq{Dir: "", Name: "sub", Mode: 0o755, Rdev: 0}},
		{OpSymlink, false, &SymlinkReq{Dir: "d", Name: "l", Target: "../t"}},
		{OpLink, false, &LinkReq{Path: "a", Dir: "b", Name: "c"}},
		{OpUnlink, false, &EntryReq{Dir: "d", Name: "f"}},
		{OpUnlink, false, &EntryReq{Dir: "d", Name: "f", Local: 4}},
		{OpRename, false, &RenameReq{Dir: "a", Name: "b", NewDir: "c", NewName: "d", Flags: 1}},
		{OpAdopt, false, &AdoptReq{Dir: "a", Name: "b", Target: "t", Layout: []byte{7, 8}, Mode: 0o100644, UID: 5, GID: 6, Flags: 1, Atime: Timespec{1, 2}, Mtime: Timespec{3, 4}}},
		{OpAdopt, true, &RemovedReply{Layout: []byte{9}}},
		{OpRelease, false, &HandleReq{Handle: 5}},
		{OpRelease, false, &HandleReq{Handle: 5, Reported: true, Objects: []byte{1, 0, 0x80}}},
		{OpOpendir, true, &HandleReply{Handle: 6}},
		{OpReadlink, true, &DataReply{Data: []byte("target")}},
		{OpReaddir, false, &ReaddirReq{Handle: 1, Offset: 2}},
		{OpReaddir, true, &ReaddirReply{Entries: []Dirent{{Ino: 1, Off: 2, Type: 0o40000, Name: "."}, {Ino: 3, Off: 4, Type: 0o100000, Name: "file"}}, EOF: true}},
		{OpRead, false, &ReadReq{Handle: 1, Offset: 1 << 33, Size: MaxIO}},
		{OpRead, false, &ReadReq{Offset: 4096, Size: 100, Path: "0123456789abcdef"}},
		{OpWrite, false, &WriteReq{Handle: 1, Offset: 8, Data: []byte("payload")}},
		{OpWrite, true, &CountReply{N: 7}},
		{OpWriteName, false, &WriteNameReq{Name: "0123456789abcdef", Offset: 8, Data: []byte("payload")}},
		{OpWriteName, true, &CountReply{N: 7}},
		{OpWriteSync, false, &WriteSyncReq{Handle: 3, Offset: 8, Flags: 1, Data: []byte("payload")}},
		{OpWriteSync, false, &WriteSyncReq{Offset: 8, Name: "0123456789abcdef", Data: []byte("payload")}},
		{OpWriteSync, true, &CountReply{N: 7}},
		{OpReserve, false, &ReserveReq{Dir: "d/e", Mode: 0o644, Count: 32}},
		{OpReserve, true, &ReserveReply{Attr: Attr{Ino: 9, Mode: 0o100644, UID: 5, GID: 6}, Inos: []uint64{9, 10, 1 << 40}}},
		{OpPlace, false, &PlaceReq{Stub: 1 << 40, CreateReq: CreateReq{Dir: "d", Name: "n", Flags: 0o301, Mode: 0o644}}},
		{OpPlace, false, &PlaceReq{Stub: 1 << 40, CreateReq: CreateReq{Dir: "d", Name: "n", Flags: 0o301, Mode: 0o644}, Writer: true}},
		{OpPlace, false, &PlaceReq{Stub: 1 << 40, CreateReq: CreateReq{Dir: "d", Name: "n", Flags: 0o301, Mode: 0o644}, DataServer: 3, Data: []byte("whole")}},
		{OpSetattr, false, &SetattrReq{Handle: 9, Valid: SetSizeAtLeast | SetMtimeNow, Size: 3901, Release: true, Objects: []byte{0b0100}}},
		{OpFsync, false, &FsyncReq{Handle: 1, Flags: 1}},
		{OpFallocate, false, &FallocateReq{Handle: 1, Offset: 2, Length: 3, Mode: 1}},
		{OpLseek, false, &LseekReq{Handle: 1, Offset: 2, Whence: 3}},
		{OpCopyRange, false, &CopyRangeReq{In: 1, OffIn: 2, Out: 3, OffOut: 4, Length: 5, Flags: 0}},
		{OpStatfs, true, &StatfsReply{Blocks: 1, Bfree: 2, Bavail: 3, Files: 4, Ffree: 5, Bsize: 4096, Frsize: 4096, NameLen: 255}},
		{OpSetxattr, false, &XattrReq{Path: "f", Handle: 0, Name: "user.k", Size: 0, Value: []byte("v"), Flags: 1}},
		{OpGetxattr, true, &XattrReply{Size: 1, Data: []byte("v")}},
		{OpPing, true, &Empty{}},
	}
}

func TestMessagesRoundTrip(t *testing.T) {
	for _, s := range samples() {
		var fresh Message
		if s.reply {
			fresh = NewReply(s.op)
		} else {
			fresh = NewRequest(s.op)
		}
		if reflect.TypeOf(fresh) != reflect.TypeOf(s.m) {
			t.Errorf("%s (reply %v): New gives %T, sample is %T", s.op, s.reply, fresh, s.m)
			continue
		}
		kind := KindRequest
		if s.reply {
			kind = KindReply
		}
		frame := AppendFrame(nil, Header{Op: s.op, Kind: kind, ID: 42, UID: 65534, GID: 100}, s.m)
		h, err := ParseHeader(frame, MaxBody)
		if err != nil {
			t.Fatalf("%s: %v", s.op, err)
		}
		if h.Op != s.op || h.ID != 42 || h.Kind != kind || int(h.BodyLen) != len(frame)-HeaderSize {
			t.Errorf("%s: header %+v", s.op, h)
		}
		if !s.reply && (h.UID != 65534 || h.GID != 100) {
			t.Errorf("%s: caller %d:%d", s.op, h.UID, h.GID)
		}
		if err := Decode(frame[HeaderSize:], fresh); err != nil {
			t.Errorf("%s: %v", s.op, err)
			continue
		}
		if !reflect.DeepEqual(fresh, s.m) {
			t.Errorf("%s: decoded %+v, want %+v", s.op, fresh, s.m)
		}
	}
}

func TestWriteDataFollowsThePrefix(t *testing.T) {
	frame := AppendFrame(nil, Header{Op: OpWrite}, &WriteReq{Handle: 1, Offset: 2, Data: []byte("data")})
	if got := frame[HeaderSize+WritePrefix:]; !bytes.Equal(got, []byte("data")) {
		t.Errorf("data after the prefix: %q", got)
	}
}

func TestParseHeaderRejects(t *testing.T) {
	good := AppendFrame(nil, Header{Op: OpPing, ID: 1}, &Empty{})
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	cases := map[string][]byte{
		"short":            good[:10],
		"length too small": mutate(func(b []byte) { b[3] = 3 }),
		"body too large":   mutate(func(b []byte) { b[0] = 0x7f }),
		"bad kind":         mutate(func(b []byte) { b[5] = 9 }),
		"reserved":         mutate(func(b []byte) { b[7] = 1 }),
	}
	for name, b := range cases {
		if _, err := ParseHeader(b, MaxBody); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestDecodeLimits(t *testing.T) {
	var e Enc
	e.Str(string(make([]byte, MaxPath+1)))
	if err := Decode(e.B, &PathReq{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("a path longer than MaxPath: %v", err)
	}
	e = Enc{}
	e.U32(1 << 30) // a billion directory entries in a few bytes
	if err := Decode(e.B, &ReaddirReply{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("an impossible entry count: %v", err)
	}
	if err := Decode([]byte{1, 2}, &HandleReq{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated: %v", err)
	}
	e = Enc{}
	e.U64(1)
	e.U8(0)
	if err := Decode(e.B, &HandleReq{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing bytes: %v", err)
	}
}

func TestProofs(t *testing.T) {
	s, c := [32]byte{1}, [16]byte{2}
	a := ClientProof([]byte("secret"), s, c)
	if !ProofEqual(a, ClientProof([]byte("secret"), s, c)) {
		t.Error("the same inputs give different proofs")
	}
	if ProofEqual(a, ClientProof([]byte("Secret"), s, c)) || ProofEqual(a, ServerProof([]byte("secret"), s, c)) {
		t.Error("a proof does not depend on the token and the role")
	}
}

// FuzzDecode feeds garbage to the header parser and to every message decoder: they must
// return errors, never panic or allocate without bound.
func FuzzDecode(f *testing.F) {
	for _, s := range samples() {
		kind := KindRequest
		if s.reply {
			kind = KindReply
		}
		f.Add(AppendFrame(nil, Header{Op: s.op, Kind: kind, ID: 1}, s.m))
	}
	f.Add([]byte{})
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := ParseHeader(data, MaxBody); err == nil {
			if int(h.BodyLen) > MaxBody {
				t.Fatalf("accepted a body of %d bytes", h.BodyLen)
			}
			_ = h.Op.String()
		}
		body := data
		if len(body) > HeaderSize {
			body = body[HeaderSize:]
		}
		for op := Op(0); op < 64; op++ {
			for _, m := range []Message{NewRequest(op), NewReply(op)} {
				if m != nil {
					Decode(body, m)
					Decode(data, m)
				}
			}
		}
		Decode(body, &Refusal{})
	})
}

// A message without a CacheRef is encoded as before the field existed (peers of before take
// it), and one with it carries it.
func TestCacheRefIsOptionalAndTrailing(t *testing.T) {
	plain := AppendFrame(nil, Header{Op: OpOpen}, &OpenReq{Path: "f", Flags: 2})
	var e Enc
	e.Str("f")
	e.U32(2)
	if want := AppendFrame(nil, Header{Op: OpOpen}, rawMessage(e.B)); !bytes.Equal(plain, want) {
		t.Fatalf("an OPEN without a cache reference is % x, want % x", plain, want)
	}
	with := AppendFrame(nil, Header{Op: OpOpen}, &OpenReq{Path: "f", Flags: 2, Cache: &CacheRef{Path: "f", Dev: 1, Ino: 2}})
	var got OpenReq
	if err := Decode(with[HeaderSize:], &got); err != nil || got.Cache == nil || *got.Cache != (CacheRef{Path: "f", Dev: 1, Ino: 2}) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	bad := append(append([]byte(nil), plain[HeaderSize:]...), 9)
	if err := Decode(bad, &got); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a cache reference of an unknown version: %v, want malformed", err)
	}
}

type rawMessage []byte

func (r rawMessage) Encode(e *Enc) { e.Raw(r) }
func (r rawMessage) Decode(d *Dec) {}
