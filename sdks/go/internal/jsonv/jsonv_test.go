package jsonv

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestCompactWritesNumbersAsTheServerDoes(t *testing.T) {
	cases := []struct {
		in   float64
		want string
	}{
		{1, "1"}, {1.0, "1"}, {-0.0, "0"}, {41, "41"}, {0.1, "0.1"}, {-2.5, "-2.5"},
		{1e15, "1000000000000000"}, {MaxSafeInt, "9007199254740992"},
		{MaxSafeInt + 2, "9007199254740994.0"}, // integral beyond 2^53: a float, with a fraction
		{1e16, "1e+16"}, {1.5e16, "1.5e+16"}, {1e21, "1e+21"}, {1e300, "1e+300"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {1e-7, "1e-07"}, {1.25e-10, "1.25e-10"},
		{123456.789, "123456.789"}, {math.MaxFloat64, "1.7976931348623157e+308"},
	}
	for _, c := range cases {
		if got := string(Compact(structpb.NewNumberValue(c.in))); got != c.want {
			t.Errorf("Compact(%v) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestCompactEscapesOnlyWhatJSONRequires(t *testing.T) {
	v, err := ToValue(map[string]any{"html": "<a href='x'>&amp;</a>", "esc": "q\"b\\n\n\t\x01\x1f", "utf8": "héllo ☃ 😀",
		"ls": "\u2028"}, "output")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"esc":"q\"b\\n\n\t\u0001\u001f","html":"<a href='x'>&amp;</a>","ls":"` + "\u2028" + `","utf8":"héllo ☃ 😀"}`
	if got := string(Compact(v)); got != want {
		t.Fatalf("Compact = %s\nwant      %s", got, want)
	}
	// encoding/json alone would count <, > and & as six bytes each.
	plain, _ := json.Marshal("<>&")
	if len(plain) == int(Size(structpb.NewStringValue("<>&"))) {
		t.Fatal("the measure must not escape HTML characters")
	}
	if Size(structpb.NewStringValue("<>&")) != 5 {
		t.Fatalf("Size(\"<>&\") = %d, want 5", Size(structpb.NewStringValue("<>&")))
	}
}

func TestCompactOfContainersAndNull(t *testing.T) {
	v, err := ToValue(map[string]any{"list": []any{1, "a", nil, true, map[string]any{}}, "empty": []int{}}, "v")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(Compact(v)), `{"empty":[],"list":[1,"a",null,true,{}]}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got := string(Compact(nil)); got != "null" {
		t.Fatalf("Compact(nil) = %s", got)
	}
}

func TestToValueTakesStructsAndRefusesWhatJSONCannotHold(t *testing.T) {
	type out struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
		Skip  string `json:"-"`
	}
	v, err := ToValue(out{Name: "x", Count: 3, Skip: "no"}, "output")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(Compact(v)); got != `{"count":3,"name":"x"}` {
		t.Fatalf("got %s", got)
	}
	_, err = ToValue(map[string]any{"rows": []any{1, int64(1)<<53 + 1}}, "output")
	if err == nil || !strings.Contains(err.Error(), "output.rows[1]: integer 9007199254740993 is too large") {
		t.Fatalf("a big integer: %v", err)
	}
	if _, err := ToValue(math.NaN(), "output"); err == nil {
		t.Fatal("NaN must be refused")
	}
	if _, err := ToValue(make(chan int), "output"); err == nil {
		t.Fatal("a channel must be refused")
	}
	// Beyond 2^53, what a double holds exactly crosses the wire unchanged.
	for _, ok := range []any{1e20, int64(1) << 60} {
		if _, err := ToValue(ok, "output"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDecodeGivesIntegersBack(t *testing.T) {
	v, _ := ToValue(map[string]any{"n": 41, "f": 1.5}, "input")
	var in struct {
		N int     `json:"n"`
		F float64 `json:"f"`
	}
	if err := Decode(v, &in); err != nil || in.N != 41 || in.F != 1.5 {
		t.Fatalf("Decode = %+v, %v", in, err)
	}
	if m, ok := Plain(v).(map[string]any); !ok || m["n"] != 41.0 {
		t.Fatalf("Plain = %#v", Plain(v))
	}
}

func TestCutKeepsTheLimitWithItsMarker(t *testing.T) {
	if got := Cut("short", 100); got != "short" {
		t.Fatalf("got %q", got)
	}
	text := strings.Repeat("é", 50_000) // 100,000 bytes
	got := Cut(text, 64*1024)
	if len(got) > 64*1024 || !utf8.ValidString(got) {
		t.Fatalf("cut to %d bytes (valid %v)", len(got), utf8.ValidString(got))
	}
	if !strings.HasSuffix(got, " of 100000 bytes]") || !strings.Contains(got, "... [cut at 65502 of") {
		t.Fatalf("marker: %q", got[len(got)-60:])
	}
	if got := Cut("bad \xff byte", 100); got != "bad \uFFFD byte" {
		t.Fatalf("invalid UTF-8: %q", got)
	}
}
