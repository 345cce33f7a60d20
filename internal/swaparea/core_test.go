package swaparea

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHeaderMatchesMkswap(t *testing.T) {
	const size = 1 << 20
	h, err := Header(size, 4096, [16]byte{1, 2, 3}, "spillway")
	if err != nil {
		t.Fatal(err)
	}
	if !ValidHeader(h, size, 4096) {
		t.Fatal("our own header is not valid")
	}
	if ValidHeader(h, 2*size, 4096) {
		t.Error("a header for 1 MiB passes for 2 MiB")
	}
	if _, err := exec.LookPath("mkswap"); err != nil {
		t.Skip("no mkswap to compare with")
	}
	f := filepath.Join(t.TempDir(), "swap")
	os.WriteFile(f, make([]byte, size), 0o600)
	if out, err := exec.Command("mkswap", "-p", "4096", f).CombinedOutput(); err != nil {
		t.Skipf("mkswap: %v: %s", err, out)
	}
	raw, _ := os.ReadFile(f)
	if !ValidHeader(raw, size, 4096) {
		t.Fatal("mkswap's header does not pass ValidHeader")
	}
	// Everything but the uuid and label (bytes 1036..1068) is what mkswap writes.
	for i := range 4096 {
		if (i < 1036 || i >= 1068) && raw[i] != h[i] {
			t.Fatalf("byte %d: mkswap wrote %#x, Header %#x", i, raw[i], h[i])
		}
	}
}

func TestHeaderRefusesBadSizes(t *testing.T) {
	if _, err := Header(9*4096, 4096, [16]byte{}, ""); err == nil || !strings.Contains(err.Error(), "at least 10") {
		t.Errorf("9 pages: %v", err)
	}
	if _, err := Header(1<<20, 4096, [16]byte{}, "a-label-longer-than-16"); err == nil {
		t.Error("a long label was taken")
	}
	if _, err := Header(1<<20, 3000, [16]byte{}, ""); err == nil {
		t.Error("page size 3000 was taken")
	}
}

func TestParseSwaps(t *testing.T) {
	text := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/dm-1                               partition\t8388604\t\t0\t\t-2\n" +
		"/dev/loop7                              partition\t262140\t\t1024\t\t5\n" +
		"/var/swap\\040file                       file\t\t65532\t\t0\t\t-3\n"
	got, err := ParseSwaps(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1] != (SwapsEntry{"/dev/loop7", "partition", 262140 << 10, 1 << 20, 5}) || got[2].Filename != "/var/swap file" || got[0].Priority != -2 {
		t.Errorf("got %+v", got)
	}
	if _, err := ParseSwaps("Filename Type Size Used Priority\n/dev/x partition lots 0 -2\n"); err == nil {
		t.Error("a size in words was taken")
	}
}

func TestParseBlockStat(t *testing.T) {
	c, err := ParseBlockStat("     120        0     9600       31     3000        0    24000      500        0      400      531\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.BytesRead != 9600*512 || c.BytesWritten != 24000*512 {
		t.Errorf("got %+v", c)
	}
	if _, err := ParseBlockStat("1 2 3"); err == nil {
		t.Error("three fields were taken")
	}
}

func TestSwaponFlags(t *testing.T) {
	for prio, want := range map[int]int{-1: 0, 0: 0x8000, 5: 0x8005, 32767: 0xffff} {
		if got, err := SwaponFlags(prio); err != nil || got != want {
			t.Errorf("priority %d: %#x %v, want %#x", prio, got, err, want)
		}
	}
	if _, err := SwaponFlags(32768); err == nil {
		t.Error("32768 was taken")
	}
}

func TestJudge(t *testing.T) {
	if v, _ := Judge(false, nil, time.Second, time.Minute); v != Running {
		t.Error("a swapoff within its bound is not running")
	}
	if v, msg := Judge(false, nil, time.Minute, time.Minute); v != Failed || !strings.Contains(msg, "stays attached") {
		t.Errorf("past its bound: %v %q", v, msg)
	}
	if v, _ := Judge(true, nil, time.Hour, time.Minute); v != Detached {
		t.Error("a finished swapoff (even a late one) is not detached")
	}
	if v, msg := Judge(true, errors.New("swapoff /dev/loop7: Cannot allocate memory"), time.Second, time.Minute); v != Failed || !strings.Contains(msg, "allocate") {
		t.Errorf("a failed swapoff: %v %q", v, msg)
	}
}
