package w3c

import (
	"context"
	"testing"
)

func TestParse(t *testing.T) {
	good := Parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "congo=t61rcWkgMzE")
	if good == nil || good.TraceID != "0af7651916cd43dd8448eb211c80319c" || good.SpanID != "b7ad6b7169203331" ||
		!good.Sampled || good.Tracestate != "congo=t61rcWkgMzE" {
		t.Fatalf("good: %+v", good)
	}
	if t2 := Parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", ""); t2 == nil || t2.Sampled {
		t.Fatalf("unsampled: %+v", t2)
	}
	// A later version may append fields.
	if Parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03-extra", "") == nil {
		t.Fatal("version 01 with more fields is valid")
	}
	for _, bad := range []string{
		"", "garbage", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
		"00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
	} {
		if Parse(bad, "") != nil {
			t.Errorf("Parse(%q) should be nil", bad)
		}
	}
}

func TestContext(t *testing.T) {
	tc := Parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "")
	ctx := NewContext(context.Background(), tc)
	if FromContext(ctx) != tc || FromContext(context.Background()) != nil {
		t.Fatal("the context carries the trace context")
	}
}
