package directive

import "testing"

func TestSplitDWPath(t *testing.T) {
	cases := []struct {
		in, variable, rest string
	}{
		{"$DW_JOB_STRIPED/a/b", "DW_JOB_STRIPED", "/a/b"},
		{"$DW_JOB_STRIPED", "DW_JOB_STRIPED", "/"},
		{"$DW_JOB_STRIPED/", "DW_JOB_STRIPED", "/"},
		{"${DW_JOB_STRIPED}", "DW_JOB_STRIPED", "/"},
		{"${DW_JOB_STRIPED}/x", "DW_JOB_STRIPED", "/x"},
		{"$DW_JOB_STRIPED/sub/", "DW_JOB_STRIPED", "/sub/"},
		{"$DW_JOB_STRIPED//a/./b/../c", "DW_JOB_STRIPED", "/a/c"},
		{"$DW_JOB_STRIPED/a/..", "DW_JOB_STRIPED", "/"},
		{"${DW_PERSISTENT_STRIPED_foo}/x", "DW_PERSISTENT_STRIPED_foo", "/x"},
		{"$DW_PERSISTENT_STRIPED_foo_bar/x", "DW_PERSISTENT_STRIPED_foo_bar", "/x"},
		{"$DW_JOB_LDBAL/ref", "DW_JOB_LDBAL", "/ref"},
		{"$DW_JOB_PRIVATE/p", "DW_JOB_PRIVATE", "/p"},
		{"$DW_JOB_STRIPED_CACHE/c", "DW_JOB_STRIPED_CACHE", "/c"},
		{"$DW_JOB_STRIPED/a%j", "DW_JOB_STRIPED", "/a%j"},
	}
	for _, c := range cases {
		v, rest, ok := SplitDWPath(c.in)
		if !ok || v != c.variable || rest != c.rest {
			t.Errorf("SplitDWPath(%q) = %q, %q, %v; want %q, %q", c.in, v, rest, ok, c.variable, c.rest)
		}
	}
	for _, bad := range []string{
		"", "/pfs/a", "DW_JOB_STRIPED/a", "$", "${}", "${DW_JOB_STRIPED", "$DW_JOB_STRIPEDx/a",
		"${DW_JOB_STRIPED}x", "$DW_JOB_STRIPED.txt", "$DW_JOB_STRIPED/../a", "$DW_JOB_STRIPED/a/../../b", "$DW_JOB_STRIPED/..",
		"$HOME/a", "$DW_PERSISTENT_STRIPED_/a", "$DW_PERSISTENT_STRIPED_9x/a", "${DW_PERSISTENT_STRIPED_a-b}/x", "${DW JOB}/x",
	} {
		if v, rest, ok := SplitDWPath(bad); ok {
			t.Errorf("SplitDWPath(%q) = %q, %q, true; want false", bad, v, rest)
		}
	}
}

func TestVariableNames(t *testing.T) {
	if VarJobStriped != "DW_JOB_STRIPED" || VarJobPrivate != "DW_JOB_PRIVATE" || VarJobLoadbalance != "DW_JOB_LDBAL" {
		t.Error("variable names changed")
	}
	if PersistentVar("x") != "DW_PERSISTENT_STRIPED_x" {
		t.Error(PersistentVar("x"))
	}
	if guessVariable("DW_JOB_STRIPPED") != VarJobStriped || guessVariable("DW_JPERSISTENT_STRIPED_abc") != "DW_PERSISTENT_STRIPED_abc" || guessVariable("HOME") != "" {
		t.Error("guessVariable")
	}
}
