package directive

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestPersistentDW(t *testing.T) {
	s := accept(t, "#DW persistentdw name=alpha\n#DW persistentdw name=Beta_2\n#DW persistentdw name=_x\n")
	want := []PersistentDW{{1, "alpha"}, {2, "Beta_2"}, {3, "_x"}}
	if !reflect.DeepEqual(s.Persistent, want) {
		t.Errorf("%+v", s.Persistent)
	}
	if PersistentVar("alpha") != "DW_PERSISTENT_STRIPED_alpha" {
		t.Error(PersistentVar("alpha"))
	}
}

func TestPersistentDWErrors(t *testing.T) {
	cases := []struct {
		src   string
		line  int
		field string
		has   []string
	}{
		{"#DW persistentdw\n", 1, "name", []string{"name is required"}},
		{"#DW persistentdw name=9x\n", 1, "name", []string{"must not start with a digit", "job ids"}},
		{"#DW persistentdw name=my-buf\n", 1, "name", []string{`'-' is not allowed`, "letters, digits and _"}},
		{"#DW persistentdw name=a.b\n", 1, "name", []string{`'.' is not allowed`}},
		{"#DW persistentdw name=buf_%u\n", 1, "name", []string{`'%' is not allowed`}},
		{"#DW persistentdw name=" + strings.Repeat("n", 65) + "\n", 1, "name", []string{"limit MaxNameBytes"}},
		{"#DW persistentdw name=a\n#DW persistentdw name=a\n", 2, "name", []string{"already attached on line 1"}},
		{"#DW persistentdw name=a pool=x\n", 1, "pool", []string{"Unsupported argument - pool", "expected one of: name"}},
		{"#DW persistentdw alpha\n", 1, "", []string{"Malformed keyword[=value]: alpha"}},
		{"#DW persistentdw name=a#x\n", 1, "name", []string{`'#' is not allowed`}},
	}
	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			findFault(t, reject(t, c.src), expectFault{c.line, c.field, c.has})
		})
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "A9", "_", "my_buffer_01", strings.Repeat("x", 64)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "9a", "a-b", "a b", "ä", strings.Repeat("x", 65), "a/b", "a$b"} {
		if err := CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) accepted it", bad)
		}
	}
}

func TestSwap(t *testing.T) {
	s := accept(t, "#DW swap 3TiB\n")
	if *s.Swap != (Swap{Line: 1, SizePerNode: 3 << 40}) {
		t.Errorf("%+v", *s.Swap)
	}
	s = accept(t, "#DW swap 1GB pool=sm_pool\n")
	if *s.Swap != (Swap{Line: 1, SizePerNode: 1e9, Pool: "sm_pool"}) {
		t.Errorf("%+v", *s.Swap)
	}
	s = accept(t, "#DW jobdw capacity=1GiB pool=p\n#DW swap 1GiB pool=p\n")
	if s.Swap.Pool != "p" || s.JobDW.Pool != "p" {
		t.Errorf("%+v", s)
	}
}

func TestSwapErrors(t *testing.T) {
	cases := []struct {
		src   string
		line  int
		field string
		has   []string
	}{
		{"#DW swap\n", 1, "size", []string{"swap size is missing", "#DW swap 10GiB"}},
		{"#DW swap 5\n", 1, "size", []string{"no unit", "5GiB"}},
		{"#DW swap 0GiB\n", 1, "size", []string{"greater than zero"}},
		{"#DW swap 1XB\n", 1, "size", []string{`unknown unit "XB"`}},
		{"#DW swap 1GiB 2GiB\n", 1, "size", []string{"more than one swap size"}},
		{"#DW swap 1GiB\n#DW swap 2GiB\n", 2, "", []string{"only one #DW swap", "line 1"}},
		{"#DW swap 1GiB size=2\n", 1, "size", []string{"Unsupported argument - size"}},
		{"#DW jobdw capacity=1GiB pool=a\n#DW swap 1GiB pool=b\n", 2, "pool", []string{"differs from the #DW jobdw pool a", "one pool"}},
	}
	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			findFault(t, reject(t, c.src), expectFault{c.line, c.field, c.has})
		})
	}
}

func TestCreatePersistent(t *testing.T) {
	cases := []struct {
		src  string
		want CreatePersistent
	}{
		{"#BB create_persistent name=alpha capacity=32GB access=striped type=scratch\n",
			CreatePersistent{1, "alpha", 32e9, []string{"striped"}, "scratch", "", "bandwidth", ""}},
		{"#BB create_persistent name=beta capacity=16GB\n",
			CreatePersistent{1, "beta", 16e9, []string{"striped"}, "scratch", "", "bandwidth", ""}},
		{"#BB create_persistent capacity=1TiB name=g access_mode=striped pool=sm_pool optimization_strategy=interference\n",
			CreatePersistent{1, "g", 1 << 40, []string{"striped"}, "scratch", "sm_pool", "interference", ""}},
		{"#BB create_persistent name=lb capacity=1GiB access=ldbalance\n",
			CreatePersistent{1, "lb", 1 << 30, []string{"loadbalance"}, "scratch", "", "bandwidth", ""}},
	}
	for _, c := range cases {
		s := accept(t, c.src)
		if len(s.Create) != 1 || !reflect.DeepEqual(s.Create[0], c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.src, s.Create, c.want)
		}
	}
}

func TestDestroyPersistent(t *testing.T) {
	s := accept(t, "#BB destroy_persistent name=alpha\n#BB destroy_persistent name=beta hurry\n#BB destroy_persistent hurry name=hurry_up\n")
	want := []DestroyPersistent{{1, "alpha", false}, {2, "beta", true}, {3, "hurry_up", true}}
	if !reflect.DeepEqual(s.Destroy, want) {
		t.Errorf("%+v", s.Destroy)
	}
}

func TestCreateDestroyErrors(t *testing.T) {
	cases := []struct {
		src   string
		line  int
		field string
		has   []string
	}{
		{"#BB create_persistent capacity=1GiB\n", 1, "name", []string{"name is required"}},
		{"#BB create_persistent name=a\n", 1, "capacity", []string{"capacity is required"}},
		{"#BB create_persistent name=a capacity=0\n", 1, "capacity", []string{"greater than zero"}},
		{"#BB create_persistent name=9x capacity=1GiB\n", 1, "name", []string{"must not start with a digit"}},
		{"#BB create_persistent name=a capacity=1GiB access=striped access_mode=striped\n", 1, "access", []string{"both access= and access_mode="}},
		// DataWarp's Table I: no private persistent instance.
		{"#BB create_persistent name=a capacity=1GiB access_mode=private\n", 1, "access_mode", []string{"private is not available for a persistent buffer", "access_mode=striped"}},
		{"#BB create_persistent name=a capacity=1GiB access=private,striped\n", 1, "access", []string{"private is not available for a persistent buffer", "access=striped"}},
		{"#BB create_persistent name=a capacity=1GiB access=striped(MFS=1GiB)\n", 1, "access", []string{"suboptions are not supported here"}},
		{"#BB create_persistent name=a capacity=1GiB type=cache\n", 1, "pfs", []string{"type=cache needs pfs="}},
		{"#BB create_persistent name=a capacity=1GiB type=swap\n", 1, "type", []string{"expected scratch"}},
		{"#BB create_persistent name=a capacity=1GiB pfs=/x\n", 1, "pfs", []string{"only for type=cache", "add type=cache"}},
		{"#BB create_persistent name=a capacity=1GiB hurry\n", 1, "", []string{"Malformed keyword[=value]: hurry"}},
		{"#BB create_persistent name=a capacity=1GiB\n#BB create_persistent name=a capacity=2GiB\n", 2, "name", []string{"already created on line 1"}},
		{"#BB destroy_persistent\n", 1, "name", []string{"name is required"}},
		{"#BB destroy_persistent name=a now\n", 1, "", []string{"Malformed keyword[=value]: now"}},
		{"#BB destroy_persistent name=a hurry hurry\n", 1, "hurry", []string{"given twice"}},
		{"#BB destroy_persistent name=hurry_data\n", 1, "name", []string{`"hurry" appears anywhere in the line`, "add the word hurry"}},
		{"#BB destroy_persistent name=a\n#BB destroy_persistent name=a\n", 2, "name", []string{"already destroyed on line 1"}},
		{"#BB create_persistent name=a capacity=1GiB\n#BB destroy_persistent name=a\n", 2, "name", []string{"creates a on line 1"}},
		{"#DW persistentdw name=a\n#BB destroy_persistent name=a\n", 2, "name", []string{"persistentdw on line 1", "before the job starts"}},
	}
	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			findFault(t, reject(t, c.src), expectFault{c.line, c.field, c.has})
		})
	}
}

func TestCreatePersistentWarnsOnDecimal(t *testing.T) {
	s := accept(t, "#BB create_persistent name=a capacity=1.5TB\n")
	if s.Create[0].Capacity != 1.5e12 || !hasWarning(s.Warnings, 1, "capacity=1500GB") {
		t.Errorf("%+v %v", s.Create, s.Warnings)
	}
}

func TestEnvVarsOrder(t *testing.T) {
	s := accept(t, "#DW jobdw access_mode=private,striped capacity=1GiB\n")
	if !slices.Equal(s.JobDW.EnvVars(), []string{"DW_JOB_STRIPED", "DW_JOB_PRIVATE"}) {
		t.Error(s.JobDW.EnvVars())
	}
}
