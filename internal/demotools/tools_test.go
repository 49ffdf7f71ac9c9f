package demotools

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestToolsAnswer calls every tool with good input and checks the answer has the fields a
// caller relies on, and that asking again gives the same answer.
func TestToolsAnswer(t *testing.T) {
	tests := []struct {
		name, method, target, body string
		check                      func(t *testing.T, m map[string]any)
	}{
		{"policy number default customer", "GET", "/v1/policy/number", "", func(t *testing.T, m map[string]any) {
			wantPrefix(t, m, "policy_number", "PN-")
			wantEq(t, m, "holder", defaultCustomer)
			wantSet(t, m, "product", "note")
		}},
		{"policy number by name", "GET", "/v1/policy/number?name=" + url.QueryEscape("王五"), "", func(t *testing.T, m map[string]any) {
			wantPrefix(t, m, "policy_number", "PN-")
			wantEq(t, m, "holder", "王五")
		}},
		{"policy status from match_1", "GET", "/v1/policy/status?match_1=" + url.QueryEscape("王五"), "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "holder", "王五")
			wantPrefix(t, m, "policy_number", "PN-")
			wantOneOf(t, m, "status", "active", "pending", "lapsed", "suspended")
			wantSet(t, m, "status_text", "premium", "effective_date")
		}},
		{"weather", "GET", "/v1/weather?city=" + url.QueryEscape("上海") + "&date=2026-07-01", "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "city", "上海")
			wantEq(t, m, "date", "2026-07-01")
			wantSet(t, m, "condition", "summary", "humidity_pct", "wind")
			temp := m["temperature_c"].(map[string]any)
			low, _ := temp["low"].(json.Number).Int64()
			high, _ := temp["high"].(json.Number).Int64()
			if low > high || high < 10 || low > 40 {
				t.Errorf("July temperatures %d..%d °C are not believable", low, high)
			}
		}},
		{"weather today", "GET", "/v1/weather?city=Berlin", "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "date", "2026-03-16")
		}},
		{"calendar indoor", "GET", "/v1/calendar/activities?type=indoor_activities&city=" + url.QueryEscape("上海") + "&date=2026-07-01", "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "city", "上海")
			wantEq(t, m, "date", "2026-07-01")
			wantEq(t, m, "type", "indoor_activities")
			wantEq(t, m, "source", "hermes demo calendar")
			wantSet(t, m, "summary")
			wantActivities(t, m, activityTypes["indoor_activities"].Kinds)
		}},
		{"calendar defaults", "GET", "/v1/calendar/activities?type=outdoor_activities", "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "city", "北京")
			wantEq(t, m, "date", "2026-03-16")
			wantEq(t, m, "type", "outdoor_activities")
			wantActivities(t, m, activityTypes["outdoor_activities"].Kinds)
		}},
		{"order query path", "GET", "/v1/orders/ORD202603120042", "", func(t *testing.T, m map[string]any) {
			m = success(t, m)
			wantEq(t, m, "order_id", "ORD202603120042")
			wantOneOf(t, m, "status", "created", "paid", "shipped", "delivered", "cancelled")
			wantSet(t, m, "carrier", "tracking_number", "placed_at", "latest_event")
			if items := m["items"].([]any); len(items) == 0 {
				t.Error("no items")
			}
		}},
		{"order query argument", "GET", "/v1/orders?order_id=ORD202603120042", "", func(t *testing.T, m map[string]any) {
			wantEq(t, success(t, m), "order_id", "ORD202603120042")
		}},
		{"urge by order", "POST", "/v1/logistics/urge", `{"order_id":"ORD202603160042","reason":"请尽快"}`, func(t *testing.T, m map[string]any) {
			m = success(t, m)
			wantPrefix(t, m, "ticket_id", "URG-")
			wantEq(t, m, "order_id", "ORD202603160042")
			wantEq(t, m, "reason", "请尽快")
			wantEq(t, m, "assigned_to", "仓库发货组")
			wantSet(t, m, "expected_response_minutes", "expected_response_by")
		}},
		{"urge by tracking number", "POST", "/v1/logistics/urge", `{"tracking_number":"SF1234567890123"}`, func(t *testing.T, m map[string]any) {
			m = success(t, m)
			wantPrefix(t, m, "ticket_id", "URG-")
			wantEq(t, m, "carrier", "SF Express")
		}},
		{"index", "GET", "/", "", func(t *testing.T, m map[string]any) {
			if tools := m["tools"].([]any); len(tools) != 13 {
				t.Errorf("index lists %d tools, want 13", len(tools))
			}
		}},
		{"a store's stock", "GET", "/v1/inventory?city=" + url.QueryEscape("北京") + "&district=" + url.QueryEscape("朝阳区") + "&store=" + url.QueryEscape("国贸店"), "", func(t *testing.T, m map[string]any) {
			wantEq(t, m, "store", "国贸店")
			wantEq(t, m, "city", "北京")
			if stock, _ := m["stock"].([]any); len(stock) != len(inventorySKUs) {
				t.Errorf("stock %v", m["stock"])
			}
		}},
		{"a sample", "POST", "/v1/samples", `{"shipping_carrier":"SF-Express"}`, func(t *testing.T, m map[string]any) {
			wantPrefix(t, m, "shipment_id", "SMP")
			wantEq(t, m, "shipping_carrier", "SF-Express")
		}},
		{"healthz", "GET", "/healthz", "", func(t *testing.T, m map[string]any) { wantEq(t, m, "status", "ok") }},
		{"health", "GET", "/health", "", func(t *testing.T, m map[string]any) { wantEq(t, m, "status", "ok") }},
		{"the broken payment tool at an ordinary amount", "POST", "/v1/broken/payments", `{"amount":12.5,"currency":"CNY"}`, func(t *testing.T, m map[string]any) {
			m = success(t, m)
			wantPrefix(t, m, "payment_id", "PAY")
			wantEq(t, m, "status", "charged")
		}},
	}
	s := newTestServer()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, s, tc.method, tc.target, tc.body, "Idempotency-Key", "req_1/call_1")
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			tc.check(t, r.obj(t))
			again := do(t, newTestServer(), tc.method, tc.target, tc.body, "Idempotency-Key", "req_1/call_1")
			if string(again.body) != string(r.body) {
				t.Errorf("same question, different answer:\n%s\n%s", r.body, again.body)
			}
		})
	}
}

// TestPolicyToolsAgree checks that the policy number and the status of one customer agree,
// and that different customers get different policies.
func TestPolicyToolsAgree(t *testing.T) {
	s := newTestServer()
	num := do(t, s, "GET", "/v1/policy/number?customer_name="+url.QueryEscape("李四"), "").obj(t)
	st := do(t, s, "GET", "/v1/policy/status?name="+url.QueryEscape("李四"), "").obj(t)
	if num["policy_number"] != st["policy_number"] {
		t.Errorf("number %v, status says %v", num["policy_number"], st["policy_number"])
	}
	other := do(t, s, "GET", "/v1/policy/number?name="+url.QueryEscape("王五"), "").obj(t)
	if other["policy_number"] == num["policy_number"] {
		t.Errorf("李四 and 王五 share policy %v", num["policy_number"])
	}
}

func TestToolsRejectBadInput(t *testing.T) {
	tests := []struct {
		name, method, target, body, field string
	}{
		{"policy status without name", "GET", "/v1/policy/status", "", "name"},
		{"weather without city", "GET", "/v1/weather", "", "city"},
		{"a stock without a store", "GET", "/v1/inventory?city=x", "", "store"},
		{"a sample without a carrier", "POST", "/v1/samples", `{}`, "shipping_carrier"},
		{"a sample with an unknown carrier", "POST", "/v1/samples", `{"shipping_carrier":"Pigeon"}`, "shipping_carrier"},
		{"weather blank city", "GET", "/v1/weather?city=+", "", "city"},
		{"weather bad date", "GET", "/v1/weather?city=Paris&date=tomorrow", "", "date"},
		{"calendar without type", "GET", "/v1/calendar/activities?city=" + url.QueryEscape("上海"), "", "type"},
		{"calendar unknown type", "GET", "/v1/calendar/activities?type=shopping", "", "type"},
		{"calendar bad date", "GET", "/v1/calendar/activities?type=indoor_activities&date=2026-3-1", "", "date"},
		{"body not an object", "POST", "/v1/echo", `["order_id"]`, "body"},
		{"body not JSON", "POST", "/v1/echo", `order_id=1`, "body"},
	}
	s := newTestServer()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, s, tc.method, tc.target, tc.body)
			if tc.field == "body" {
				wantError(t, r, http.StatusBadRequest, "INVALID_ARGUMENT")
				return
			}
			wantArgError(t, r, tc.field)
		})
	}
}

// A type calendar_query does not know is refused with the types it knows.
func TestCalendarNamesItsTypes(t *testing.T) {
	r := do(t, newTestServer(), "GET", "/v1/calendar/activities?type=indoor", "")
	wantArgError(t, r, "type")
	hint, _ := r.obj(t)["recovery_hint"].(string)
	for _, typ := range []string{"indoor_activities", "outdoor_activities"} {
		if !strings.Contains(hint, typ) {
			t.Errorf("recovery_hint %q does not name %s", hint, typ)
		}
	}
}

// wantActivities checks calendar_query's activities: three to five of the type's kinds, none
// twice, earliest first, each with a believable time, length and price.
func wantActivities(t *testing.T, m map[string]any, kinds []activityKind) {
	t.Helper()
	list, _ := m["activities"].([]any)
	if len(list) < 3 || len(list) > 5 {
		t.Fatalf("%d activities, want 3 to 5: %v", len(list), m["activities"])
	}
	seen := map[string]bool{}
	last := ""
	for _, v := range list {
		act := v.(map[string]any)
		name, _ := act["name"].(string)
		i := slices.IndexFunc(kinds, func(k activityKind) bool { return k.Name == name })
		if i < 0 || seen[name] {
			t.Errorf("activity %q is not one of the type's or comes twice", name)
			continue
		}
		seen[name] = true
		k := kinds[i]
		wantSet(t, act, "place")
		start, _ := act["start_time"].(string)
		var hh, mm int
		if _, err := fmt.Sscanf(start, "%02d:%02d", &hh, &mm); err != nil || len(start) != 5 || hh < k.Start[0] || hh > k.Start[1] || (mm != 0 && mm != 30) {
			t.Errorf("%s starts at %q", name, start)
		}
		if start < last {
			t.Errorf("%s at %s comes after %s", name, start, last)
		}
		last = start
		minutes, _ := act["duration_minutes"].(json.Number).Int64()
		price, _ := act["price_cny"].(json.Number).Int64()
		if minutes < int64(k.Duration[0]) || minutes > int64(k.Duration[1]) || price < int64(k.Price[0]) || price > int64(k.Price[1]) {
			t.Errorf("%s: %d minutes for %d CNY", name, minutes, price)
		}
	}
}

// The order tools answer failures in their contract's shape: {"failure": {error_code,
// recovery_hint}} under the error's status.
func TestOrderToolsAnswerTheirContractsFailures(t *testing.T) {
	s := newTestServer()
	for _, tc := range []struct {
		name, method, target, body string
		status                     int
		code                       string
	}{
		{"order without id", "GET", "/v1/orders/", "", 400, "INVALID_ORDER_ID"},
		{"order without id, no slash", "GET", "/v1/orders", "", 400, "INVALID_ORDER_ID"},
		{"order bad id", "GET", "/v1/orders/" + url.PathEscape("a b"), "", 400, "INVALID_ORDER_ID"},
		{"order id of the old form", "GET", "/v1/orders/ORD-20260312-0042", "", 400, "INVALID_ORDER_ID"},
		{"order from the future", "GET", "/v1/orders/ORD202612310001", "", 404, "ORDER_NOT_FOUND"},
		{"order of no day", "GET", "/v1/orders/ORD202602300001", "", 404, "ORDER_NOT_FOUND"},
		{"urge without order or tracking", "POST", "/v1/logistics/urge", `{"reason":"hurry"}`, 400, "INVALID_ARGUMENT"},
		{"urge bad tracking", "POST", "/v1/logistics/urge", `{"tracking_number":"#1"}`, 400, "INVALID_ARGUMENT"},
		{"urge an order that does not exist", "POST", "/v1/logistics/urge", `{"order_id":"ORD209901010001"}`, 404, "ORDER_NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, s, tc.method, tc.target, tc.body)
			wantFailure(t, r, tc.status, tc.code)
		})
	}
}

// TestUrgeDeliveredOrder checks the tool's own error: a delivered order cannot be urged.
func TestUrgeDeliveredOrder(t *testing.T) {
	s := newTestServer()
	id := ""
	for i := range 1000 {
		if o, ok := s.orderFor(fmt.Sprintf("ORD20260301%04d", i)); ok && o.Status == "delivered" {
			id = o.ID
			break
		}
	}
	if id == "" {
		t.Fatal("no delivered order among 1000 ids")
	}
	wantFailure(t, do(t, s, "POST", "/v1/logistics/urge", `{"order_id":"`+id+`"}`), http.StatusConflict, "ORDER_DELIVERED")
	m := success(t, do(t, s, "GET", "/v1/orders/"+id, "").obj(t))
	wantSet(t, m, "delivered_at")
}

// Every status of the seed's enum occurs, and only those.
func TestOrdersHaveTheSeedsStatuses(t *testing.T) {
	s := newTestServer()
	seen := map[string]bool{}
	for day := 0; day < 20; day++ {
		for i := range 50 {
			o, ok := s.orderFor(fmt.Sprintf("ORD%s%04d", testNow.AddDate(0, 0, -day).Format("20060102"), i))
			if !ok {
				t.Fatalf("day -%d: not found", day)
			}
			seen[o.Status] = true
		}
	}
	for _, st := range []string{"created", "paid", "shipped", "delivered", "cancelled"} {
		if !seen[st] {
			t.Errorf("no order is %s", st)
		}
		delete(seen, st)
	}
	if len(seen) > 0 {
		t.Errorf("statuses outside the seed's enum: %v", seen)
	}
}

func TestHTTPErrors(t *testing.T) {
	s := newTestServer()
	wantError(t, do(t, s, "GET", "/v1/nothing", ""), http.StatusNotFound, "NOT_FOUND")
	wantError(t, do(t, s, "DELETE", "/v1/logistics/urge", ""), http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
	big := `{"message":"` + strings.Repeat("x", maxBodyBytes) + `"}`
	wantError(t, do(t, s, "POST", "/v1/echo", big), http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
}

func wantEq(t *testing.T, m map[string]any, key string, want any) {
	t.Helper()
	if !reflect.DeepEqual(m[key], want) {
		t.Errorf("%s = %#v, want %#v", key, m[key], want)
	}
}

func wantPrefix(t *testing.T, m map[string]any, key, prefix string) {
	t.Helper()
	if s, _ := m[key].(string); !strings.HasPrefix(s, prefix) || len(s) <= len(prefix) {
		t.Errorf("%s = %#v, want %s…", key, m[key], prefix)
	}
}

func wantOneOf(t *testing.T, m map[string]any, key string, values ...string) {
	t.Helper()
	s, _ := m[key].(string)
	for _, v := range values {
		if s == v {
			return
		}
	}
	t.Errorf("%s = %#v, want one of %v", key, m[key], values)
}

func wantSet(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := m[k]; !ok || v == nil || v == "" {
			t.Errorf("%s is missing in %v", k, m)
		}
	}
}

// The broken tools' bugs, as the seed tells them: order_query_broken's error code has a
// trailing space; the payment tool answers text, not JSON, at amount 0.
func TestTheBrokenToolsBreakTheirContracts(t *testing.T) {
	r := doRequest(t, newTestServer(), httptest.NewRequest("GET", "/v1/broken/orders?order_id=ORD209901010001", nil))
	if r.status != 404 || !strings.Contains(string(r.body), `"error_code":"ORDER_NOT_FOUND "`) {
		t.Errorf("order_query_broken: %d %s", r.status, r.body)
	}
	rec := httptest.NewRecorder()
	newTestServer().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/broken/payments", strings.NewReader(`{"amount":0,"currency":"CNY"}`)))
	if rec.Code != 200 || json.Valid(rec.Body.Bytes()) || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Errorf("amount 0: %d %s %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
}
