package spillwaycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/warpfs/mount"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

const stripesUsage = `Usage: spillway stripes [--json] FILE...

Show how files of a Spillway mount are striped: the stripe size, the number of servers the
file uses (stripe width) and the first one (start), and which storage node holds which
stripes and how many bytes of the file. An instance placed on several storage nodes stripes
its files over all of them; one on a single node is not striped (its files hold their data;
a stripe configuration set on them is kept and shown). A loadbalance instance is not striped
either: each of its storage nodes holds a full copy (a replica); the command names them and
the one this node reads now (it moves to the next when that node stops answering).

A file's or a directory's striping is set through the extended attribute
user.spillway.layout while the file is empty (a directory's is inherited by the files and
directories created in it):

  setfattr -n user.spillway.layout -v "stripe_size=1048576 stripe_width=2" $DW_JOB_STRIPED/dir

(stripe_size: a multiple of 4096; stripe_width: 1 to the instance's servers; start: the
first server, 0-based). See docs/mounts.md.

Exit status: 0 every FILE shown; 1 a FILE could not be read; 64 bad usage.

Examples:
  spillway stripes $DW_JOB_STRIPED/checkpoint.h5
  spillway stripes --json $DW_JOB_STRIPED/* | jq '.[].servers'
`

// fileStripes is one file's striping, as --json prints it.
type fileStripes struct {
	Path        string          `json:"path"`
	Size        int64           `json:"size"`
	Striped     bool            `json:"striped"`
	StripeSize  uint64          `json:"stripe_size,omitempty"`
	StripeWidth uint32          `json:"stripe_width,omitempty"`
	Start       uint32          `json:"start"`
	Stripes     uint64          `json:"stripes"`
	Servers     []serverStripes `json:"servers,omitempty"`
	// A loadbalance mount: the storage nodes holding a copy, in the order the mount tries
	// them, and the one this node reads now.
	Replicas []string `json:"replicas,omitempty"`
	Reading  string   `json:"reading,omitempty"`
}

// serverStripes is what one server holds of a file.
type serverStripes struct {
	Index   int    `json:"index"` // in the instance's servers
	Node    string `json:"node"`
	Stripes uint64 `json:"stripes"`
	Bytes   uint64 `json:"bytes"`
	First   int64  `json:"first_stripe"` // -1: none
}

func stripesMain(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("spillway stripes", stripesUsage, stderr)
	asJSON := fs.Bool("json", false, "print a JSON array, one object per FILE")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, "spillway stripes: name at least one FILE\n\n"+stripesUsage)
		return 64
	}
	var all []fileStripes
	status := 0
	for _, path := range fs.Args() {
		fsx, err := readStripes(path)
		if err != nil {
			fmt.Fprintf(stderr, "spillway stripes: %s: %v\n", path, err)
			status = 1
			continue
		}
		all = append(all, fsx)
	}
	if *asJSON {
		out, _ := json.MarshalIndent(all, "", "  ")
		fmt.Fprintln(stdout, string(out))
		return status
	}
	for _, f := range all {
		switch {
		case len(f.Replicas) > 0:
			fmt.Fprintf(stdout, "%s: %d bytes, not striped: a loadbalance instance, a full copy on each of its %d storage nodes (%s); this node reads the copy on %s\n",
				f.Path, f.Size, len(f.Replicas), strings.Join(f.Replicas, ", "), f.Reading)
			continue
		case !f.Striped && f.StripeSize > 0:
			fmt.Fprintf(stdout, "%s: %d bytes, not striped (its instance is on one storage node); stripe configuration kept: stripe_size %d, stripe_width %d\n",
				f.Path, f.Size, f.StripeSize, f.StripeWidth)
			continue
		case !f.Striped:
			fmt.Fprintf(stdout, "%s: %d bytes, not striped (its instance is on one storage node)\n", f.Path, f.Size)
			continue
		}
		fmt.Fprintf(stdout, "%s: %d bytes in %d stripes of %d bytes over %d server(s), starting at server %d\n",
			f.Path, f.Size, f.Stripes, f.StripeSize, f.StripeWidth, f.Start)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SERVER\tNODE\tSTRIPES\tBYTES\tFIRST STRIPE")
		for _, s := range f.Servers {
			first := "-"
			if s.First >= 0 {
				first = fmt.Sprint(s.First)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\n", s.Index, s.Node, s.Stripes, s.Bytes, first)
		}
		tw.Flush()
	}
	return status
}

// readStripes reads a file's striping from its mount's extended attributes.
func readStripes(path string) (fileStripes, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStripes{}, err
	}
	out := fileStripes{Path: path, Size: st.Size()}
	if replicas, err := getxattr(path, mount.ReplicasXattr); err == nil {
		out.Replicas = strings.Fields(replicas)
		if out.Reading, err = getxattr(path, mount.ReplicaXattr); err != nil {
			return out, fmt.Errorf("reading the replica this node reads: %w", err)
		}
		return out, nil
	}
	text, err := getxattr(path, server.UserLayoutXattr)
	if errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.ENOTSUP) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("reading its layout: %w (is it on a Spillway mount?)", err)
	}
	names, err := getxattr(path, mount.ServersXattr)
	if errors.Is(err, syscall.ENODATA) {
		// One server: the configuration a user set is kept (width 1), nothing laid out.
		l, err := stripe.ParseText(text, stripe.Layout{Size: stripe.DefaultSize, Width: 1, Servers: 1})
		if err != nil {
			return out, fmt.Errorf("layout %q: %w", text, err)
		}
		out.StripeSize, out.StripeWidth = l.Size, l.Width
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("reading the instance's servers: %w", err)
	}
	nodes := strings.Fields(names)
	l, err := stripe.ParseText(text, stripe.Layout{Size: stripe.Unit, Width: 1, Servers: uint32(len(nodes))})
	if err != nil {
		return out, fmt.Errorf("layout %q: %w", text, err)
	}
	out.Striped, out.StripeSize, out.StripeWidth, out.Start = true, l.Size, l.Width, l.Start
	if !st.Mode().IsRegular() {
		return out, nil // a directory: the layout its new files take
	}
	size := uint64(st.Size())
	out.Stripes = (size + l.Size - 1) / l.Size
	for s, node := range nodes {
		if l.Slot(s) < 0 {
			continue
		}
		held := serverStripes{Index: s, Node: node, Bytes: l.ObjectSize(size, s), First: -1}
		held.Stripes = (held.Bytes + l.Size - 1) / l.Size
		if held.Stripes > 0 {
			held.First = int64(l.Slot(s))
		}
		out.Servers = append(out.Servers, held)
	}
	return out, nil
}

func getxattr(path, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
