// Package jsonv converts between Go values, JSON and google.protobuf.Value the way the
// Cyclone server does: an output's size is its compact JSON in UTF-8 bytes as the server
// writes it (integral numbers within 2^53 without a fraction, other numbers in their
// shortest round-trip form, strings escaped only where JSON requires).
package jsonv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

// MaxSafeInt is the largest integer a JSON number (a double on the wire) holds exactly.
const MaxSafeInt = 1 << 53

// Marshal is encoding/json's compact encoding of v without HTML escaping: "<", ">" and
// "&" stay as they are, as the server writes them (encoding/json would write \u003c).
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ToValue converts v (anything encoding/json marshals: maps, slices, structs with json
// tags, json.RawMessage, ...) into a google.protobuf.Value. A number JSON cannot carry
// exactly (an integer beyond 2^53) is refused, naming its path under `path`.
func ToValue(v any, path string) (*structpb.Value, error) {
	raw, err := Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ValueFromJSON(raw, path)
}

// ValueFromJSON parses JSON text into a google.protobuf.Value (see ToValue).
func ValueFromJSON(raw []byte, path string) (*structpb.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return build(generic, path)
}

func build(x any, path string) (*structpb.Value, error) {
	switch t := x.(type) {
	case nil:
		return structpb.NewNullValue(), nil
	case bool:
		return structpb.NewBoolValue(t), nil
	case string:
		return structpb.NewStringValue(t), nil
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%s: %s is not a JSON number a double can hold", path, t)
		}
		if len(t) > 15 && !strings.ContainsAny(string(t), ".eE") && !exact(string(t), f) {
			return nil, fmt.Errorf("%s: integer %s is too large for JSON numbers (limit 2**53); send it as a string", path, t)
		}
		return structpb.NewNumberValue(f), nil
	case []any:
		list := &structpb.ListValue{Values: make([]*structpb.Value, len(t))}
		for i, item := range t {
			v, err := build(item, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			list.Values[i] = v
		}
		return structpb.NewListValue(list), nil
	case map[string]any:
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(t))}
		for key, item := range t {
			v, err := build(item, path+"."+key)
			if err != nil {
				return nil, err
			}
			s.Fields[key] = v
		}
		return structpb.NewStructValue(s), nil
	}
	return nil, fmt.Errorf("%s: %T is not JSON", path, x)
}

// exact reports whether the integer literal is exactly the double f: an integer beyond
// 2^53 that a double cannot hold would lose digits on the wire, so it is refused (a float
// beyond 2^53, which encoding/json writes without a fraction, is exact).
func exact(literal string, f float64) bool {
	n, ok := new(big.Int).SetString(literal, 10)
	if !ok {
		return false
	}
	m, _ := big.NewFloat(f).Int(nil)
	return n.Cmp(m) == 0
}

// Compact is v as the server writes it, in compact JSON (nil is null). Object keys are
// sorted, so the text is deterministic; the size is what counts.
func Compact(v *structpb.Value) []byte {
	var b []byte
	return appendValue(b, v)
}

// Size is len(Compact(v)): the measure of the server's payload limit.
func Size(v *structpb.Value) int64 { return int64(len(Compact(v))) }

// Decode unmarshals v into out (any encoding/json target) through its compact JSON, so
// an integral number decodes into an int field.
func Decode(v *structpb.Value, out any) error {
	return json.Unmarshal(Compact(v), out)
}

// Plain is v as encoding/json decodes JSON into `any`: nil, bool, float64, string,
// []any, map[string]any.
func Plain(v *structpb.Value) any {
	if v == nil {
		return nil
	}
	return v.AsInterface()
}

func appendValue(b []byte, v *structpb.Value) []byte {
	switch k := v.GetKind().(type) {
	case *structpb.Value_BoolValue:
		return strconv.AppendBool(b, k.BoolValue)
	case *structpb.Value_NumberValue:
		return appendNumber(b, k.NumberValue)
	case *structpb.Value_StringValue:
		return appendString(b, k.StringValue)
	case *structpb.Value_ListValue:
		b = append(b, '[')
		for i, item := range k.ListValue.GetValues() {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, item)
		}
		return append(b, ']')
	case *structpb.Value_StructValue:
		return appendStruct(b, k.StructValue)
	}
	return append(b, "null"...) // NullValue, or no kind set
}

func appendStruct(b []byte, s *structpb.Struct) []byte {
	keys := make([]string, 0, len(s.GetFields()))
	for key := range s.GetFields() {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	b = append(b, '{')
	for i, key := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, key)
		b = append(b, ':')
		b = appendValue(b, s.Fields[key])
	}
	return append(b, '}')
}

// appendNumber writes a double as the server does: an integral one within 2^53 as an
// integer; any other in its shortest round-trip form, in exponent notation when its
// decimal exponent is below -4 or at least 16 (1e+16, 1.5e-05), else with a fraction
// (9007199254740994.0). NaN and infinities are not JSON; they are written as null here
// (the server refuses them, so such an output is never measured against the limit).
func appendNumber(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	if f == math.Trunc(f) && math.Abs(f) <= MaxSafeInt {
		return strconv.AppendInt(b, int64(f), 10)
	}
	exp := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX, at least two exponent digits
	e, _ := strconv.Atoi(exp[strings.IndexByte(exp, 'e')+1:])
	if e < -4 || e >= 16 {
		return append(b, exp...)
	}
	fixed := strconv.FormatFloat(f, 'f', -1, 64)
	b = append(b, fixed...)
	if !strings.ContainsRune(fixed, '.') {
		b = append(b, ".0"...)
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendString escapes only what JSON requires: the quote, the backslash and the control
// characters below U+0020; everything else is written as UTF-8.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			b = append(b, '\\', '"')
		case c == '\\':
			b = append(b, '\\', '\\')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// Cut returns text within limit bytes of UTF-8, marker included, as the server keeps a
// failure's message and details: past the limit it is cut at a character boundary and
// marked "... [cut at KEEP of N bytes]". Invalid UTF-8 becomes U+FFFD first (protobuf
// strings must be UTF-8).
func Cut(text string, limit int) string {
	text = strings.ToValidUTF8(text, "\uFFFD")
	if len(text) <= limit {
		return text
	}
	keep := limit - len(fmt.Sprintf("... [cut at %d of %d bytes]", limit, len(text)))
	if keep < 0 {
		keep = 0
	}
	head := []byte(text[:keep])
	for len(head) > 0 && !utf8.Valid(head) {
		head = head[:len(head)-1]
	}
	return string(head) + fmt.Sprintf("... [cut at %d of %d bytes]", keep, len(text))
}
