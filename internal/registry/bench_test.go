package registry_test

import (
	"os"
	"testing"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
)

func seedCompiled(b *testing.B) *contract.Compiled {
	b.Helper()
	data, err := os.ReadFile("testdata/contract-order-query.yaml")
	if err != nil {
		b.Fatal(err)
	}
	c, err := registry.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	k, err := contract.Compile(c, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	return k
}

// What checking a call costs under the seed's contract: the arguments (router), the answer
// (worker), and a refusal (the problems written out).
func BenchmarkContract(b *testing.B) {
	k := seedCompiled(b)
	args := []byte(`{"order_id":"ORD202603120042"}`)
	bad := []byte(`{"order_id":"ORD-20260312-0042"}`)
	answer := []byte(`{"success":{"order_id":"ORD202603120042","status":"shipped","status_text":"运输中","placed_at":"2026-03-12T08:03:00+08:00","items":[{"sku":"SKU-15596","name":"移动电源 20000mAh","quantity":2,"unit_price":199},{"sku":"SKU-72214","name":"运动跑鞋","quantity":1,"unit_price":599}],"total":{"amount":997,"currency":"CNY"},"shipping_city":"成都","carrier":"YTO Express","tracking_number":"YT1234567890123","latest_event":{"time":"2026-03-15T09:05:00+08:00","location":"成都","description":"快件已到达 成都 转运中心"},"estimated_delivery":"2026-03-17"}}`)
	b.Run("input", func(b *testing.B) {
		for b.Loop() {
			if err := k.CheckInput(args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("input_refused", func(b *testing.B) {
		for b.Loop() {
			if err := k.CheckInput(bad); err == nil {
				b.Fatal("taken")
			}
		}
	})
	b.Run("output", func(b *testing.B) {
		b.SetBytes(int64(len(answer)))
		for b.Loop() {
			if v := k.CheckOutput(answer, false); v.Violation != "" {
				b.Fatal(v.Violation)
			}
		}
	})
	b.Run("compile", func(b *testing.B) {
		for b.Loop() {
			if _, err := contract.Compile(k.Contract, 1, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}
