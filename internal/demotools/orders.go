package demotools

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

type carrier struct {
	Name, NameZH, Prefix string
	Digits               int
	Hotline              string
}

var carriers = []carrier{
	{"SF Express", "顺丰速运", "SF", 13, "95338"},
	{"JD Logistics", "京东物流", "JDV", 12, "950616"},
	{"ZTO Express", "中通快递", "ZT", 12, "95311"},
	{"YTO Express", "圆通速递", "YT", 13, "95554"},
	{"China Post EMS", "中国邮政EMS", "EMS", 11, "11183"},
}

type catalogItem struct {
	SKU, Name string
	Price     float64
}

var catalog = []catalogItem{
	{"SKU-10231", "无线降噪耳机", 899},
	{"SKU-20417", "机械键盘（茶轴）", 459},
	{"SKU-31088", "27 英寸 4K 显示器", 2199},
	{"SKU-40552", "人体工学椅", 1299},
	{"SKU-50963", "USB-C 扩展坞", 329},
	{"SKU-61720", "保温杯 500ml", 129},
	{"SKU-72214", "运动跑鞋", 599},
	{"SKU-83405", "空气净化器滤芯", 269},
	{"SKU-94871", "咖啡豆 1kg", 158},
	{"SKU-15596", "移动电源 20000mAh", 199},
}

var shipCities = []string{"上海", "北京", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "苏州"}

// Orders answer in the shape of their contract (seed 003 §3.2,
// examples/contracts/order_query.yaml): {"success": {…}} or {"failure": {"error_code",
// "recovery_hint"}}, with the seed's order ids (ORD + the day it was placed, YYYYMMDD, + a
// 4-digit number) and statuses (created, paid, shipped, delivered, cancelled).

// orderStages are what a demo order can be doing, by status, with how many days after it was
// placed it can be in each.
var orderStages = []struct {
	Status, Text string
	Age          [2]int
}{
	{"created", "待付款", [2]int{0, 0}},
	{"paid", "已付款，仓库处理中", [2]int{0, 1}},
	{"shipped", "已发货", [2]int{1, 2}},
	{"shipped", "运输中", [2]int{2, 4}},
	{"shipped", "派送中", [2]int{3, 5}},
	{"delivered", "已签收", [2]int{3, 1 << 30}},
}

var orderIDPattern = regexp.MustCompile(`^ORD[0-9]{12}$`)

// order is a demo order, derived from its id and the current day.
type order struct {
	ID, Status, StatusText string
	Placed                 time.Time
	Items                  []map[string]any
	Total                  float64
	Carrier                carrier
	Tracking               string // empty until shipped
	City                   string
	EstimatedDelivery      time.Time
	DeliveredAt            time.Time // zero unless delivered
}

// orderFor returns the order id names; false when there is none (its day is not a date, is
// in the future, or is more than two years ago).
func (s *server) orderFor(id string) (order, bool) {
	placedDay, err := time.ParseInLocation("20060102", id[3:11], demoZone)
	today := s.today()
	if err != nil || placedDay.After(today) || placedDay.Before(today.AddDate(-10, 0, 0)) {
		return order{}, false
	}
	r := seeded("order", id)
	age := int(today.Sub(placedDay).Hours() / 24)
	var fits []int
	for i, st := range orderStages {
		if age >= st.Age[0] && age <= st.Age[1] {
			fits = append(fits, i)
		}
	}
	st := orderStages[pick(r, fits)]
	o := order{ID: id, Status: st.Status, StatusText: st.Text, Carrier: pick(r, carriers), City: pick(r, shipCities)}
	if age >= 1 && r.IntN(20) == 0 {
		o.Status, o.StatusText = "cancelled", "已取消（用户申请）"
	}
	o.Placed = placedDay.Add(time.Duration(between(r, 8*60, 23*60)) * time.Minute)
	if o.Placed.After(s.now()) {
		o.Placed = s.now().Add(-time.Minute)
	}
	n := between(r, 1, 3)
	perm := r.Perm(len(catalog))[:n]
	for _, i := range perm {
		it := catalog[i]
		qty := between(r, 1, 2)
		o.Items = append(o.Items, map[string]any{"sku": it.SKU, "name": it.Name, "quantity": qty, "unit_price": it.Price})
		o.Total += it.Price * float64(qty)
	}
	tracking := o.Carrier.Prefix + digits(r, o.Carrier.Digits)
	if o.Status == "shipped" || o.Status == "delivered" {
		o.Tracking = tracking
	}
	// Promised 3 to 5 days after ordering, but never in the past for a parcel still on its way.
	est := o.Placed.AddDate(0, 0, between(r, 3, 5))
	floor := today.AddDate(0, 0, 1)
	if o.StatusText == "派送中" {
		floor = today
	}
	if est.Before(floor) {
		est = floor
	}
	o.EstimatedDelivery = est
	if o.Status == "delivered" {
		o.DeliveredAt = o.Placed.AddDate(0, 0, between(r, 2, min(age, 5))).Add(time.Duration(between(r, -6*60, 6*60)) * time.Minute)
		if o.DeliveredAt.After(s.now()) {
			o.DeliveredAt = s.now().Add(-time.Hour)
		}
	}
	return o, true
}

// orderID reads the order id from the path ({order_id}) or the order_id argument, and finds
// the order.
func (s *server) order(r *http.Request, a args) (order, error) {
	id := strings.TrimSpace(r.PathValue("order_id"))
	if id == "" {
		var err error
		if id, _, err = a.str("order_id"); err != nil {
			return order{}, invalidOrderID(err.Error())
		}
	}
	if id == "" {
		return order{}, invalidOrderID(`missing required argument "order_id"`)
	}
	if !orderIDPattern.MatchString(id) {
		return order{}, invalidOrderID(quote(id) + " is not an order id")
	}
	o, ok := s.orderFor(id)
	if !ok {
		return order{}, &toolError{Status: http.StatusNotFound, Code: "ORDER_NOT_FOUND",
			Hint:    "no order " + id + " exists; ask the customer to check the order number (ORD, the day it was placed as YYYYMMDD, then 4 digits)",
			Message: "order " + id + " not found"}
	}
	return o, nil
}

func invalidOrderID(problem string) *toolError {
	return &toolError{Status: http.StatusBadRequest, Code: "INVALID_ORDER_ID",
		Hint:    `set "order_id" to an order number: ORD, the day it was placed as YYYYMMDD, then 4 digits, e.g. "ORD202603160042"`,
		Message: problem}
}

// latestEvent describes the last tracking event of o.
func (s *server) latestEvent(o order) map[string]string {
	r := seeded("event", o.ID)
	var at time.Time
	var text string
	switch {
	case o.Status == "created":
		at, text = o.Placed, "订单已提交，等待付款"
	case o.Status == "paid":
		at, text = o.Placed.Add(20*time.Minute), "订单已付款，仓库正在拣货打包"
	case o.Status == "cancelled":
		at, text = o.Placed.Add(time.Duration(between(r, 1, 20))*time.Hour), "订单已取消，款项原路退回"
	case o.StatusText == "已发货":
		at, text = o.Placed.Add(time.Duration(between(r, 6, 20))*time.Hour), fmt.Sprintf("%s 已揽收", o.Carrier.NameZH)
	case o.StatusText == "运输中":
		at, text = s.now().Add(-time.Duration(between(r, 1, 9))*time.Hour), fmt.Sprintf("快件已到达 %s 转运中心", pick(r, shipCities))
	case o.StatusText == "派送中":
		at, text = s.now().Add(-time.Duration(between(r, 1, 3))*time.Hour), fmt.Sprintf("快件正在派送中，快递员电话 138%s", digits(r, 8))
	default:
		at, text = o.DeliveredAt, "已签收，签收人：本人"
	}
	if at.After(s.now()) {
		at = s.now()
	}
	return map[string]string{"time": at.In(demoZone).Format(time.RFC3339), "location": o.City, "description": text}
}

// orderQuery is order_query: the state of an order, its items and its shipment.
func (s *server) orderQuery(r *http.Request, a args) (any, error) {
	o, err := s.order(r, a)
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"order_id":      o.ID,
		"status":        o.Status,
		"status_text":   o.StatusText,
		"placed_at":     o.Placed.Format(time.RFC3339),
		"items":         o.Items,
		"total":         map[string]any{"amount": o.Total, "currency": "CNY"},
		"shipping_city": o.City,
		"carrier":       o.Carrier.Name,
		"carrier_zh":    o.Carrier.NameZH,
		"latest_event":  s.latestEvent(o),
	}
	if o.Tracking != "" {
		out["tracking_number"] = o.Tracking
	} else {
		out["tracking_number"] = nil
	}
	switch o.Status {
	case "delivered":
		out["delivered_at"] = o.DeliveredAt.Format(time.RFC3339)
	case "cancelled":
	default:
		out["estimated_delivery"] = o.EstimatedDelivery.Format(dateLayout)
	}
	return out, nil
}

var trackingPattern = regexp.MustCompile(`^[A-Za-z0-9]{6,32}$`)

// carrierOf guesses the carrier of a tracking number from its prefix.
func carrierOf(tracking string) carrier {
	upper := strings.ToUpper(tracking)
	best := carrier{}
	for _, c := range carriers {
		if strings.HasPrefix(upper, c.Prefix) && len(c.Prefix) > len(best.Prefix) {
			best = c
		}
	}
	if best.Prefix == "" {
		return pick(seeded("carrier", tracking), carriers)
	}
	return best
}

// logisticsUrge is logistics_urge: opens an urge ticket with the carrier (or the warehouse,
// for an order not yet shipped).
func (s *server) logisticsUrge(r *http.Request, a args) (any, error) {
	var o order
	haveOrder := a.has("order_id")
	if haveOrder {
		var err error
		if o, err = s.order(r, a); err != nil {
			return nil, err
		}
	}
	tracking, ok, err := a.str("tracking_number")
	if err != nil {
		return nil, err
	}
	if ok && !trackingPattern.MatchString(tracking) {
		return nil, badArg("tracking_number", "a tracking number of 6 to 32 letters and digits, e.g. \"SF1234567890123\"",
			quote(tracking)+" is not a tracking number")
	}
	if !haveOrder && !ok {
		return nil, missingArg("order_id", "the order number (or give \"tracking_number\" instead), e.g. \"ORD202603160042\"")
	}
	// reason, as the seed's blueprint says it; note is its older name.
	reason, _, err := a.str("reason")
	if err != nil {
		return nil, err
	}
	if reason == "" {
		if reason, _, err = a.str("note"); err != nil {
			return nil, err
		}
	}
	if utf8.RuneCountInString(reason) > 500 {
		return nil, badArg("reason", "a reason of at most 500 characters", "too long")
	}

	var c carrier
	if haveOrder {
		switch o.Status {
		case "delivered":
			return nil, &toolError{Status: http.StatusConflict, Code: "ORDER_DELIVERED",
				Hint: fmt.Sprintf("order %s was delivered at %s; open an after-sales case instead of urging delivery",
					o.ID, o.DeliveredAt.In(demoZone).Format(time.RFC3339)),
				Message: "order " + o.ID + " is already delivered"}
		case "cancelled":
			return nil, &toolError{Status: http.StatusConflict, Code: "ORDER_CANCELLED",
				Hint:    "order " + o.ID + " was cancelled; nothing will be delivered, tell the customer or place a new order",
				Message: "order " + o.ID + " is cancelled"}
		}
		c, tracking = o.Carrier, o.Tracking // the order's own shipment wins
	} else {
		c = carrierOf(tracking)
	}
	team := c.NameZH + "客服"
	if haveOrder && (o.Status == "created" || o.Status == "paid") {
		team = "仓库发货组" // not shipped yet: the warehouse answers
	}

	rnd := seeded("urge", r.Header.Get("Idempotency-Key"), o.ID, tracking, reason)
	minutes := pick(rnd, []int{30, 60, 120, 240})
	out := map[string]any{
		"ticket_id":                 fakeID(rnd, "URG-", 10),
		"status":                    "submitted",
		"assigned_to":               team,
		"carrier":                   c.Name,
		"expected_response_minutes": minutes,
		"expected_response_by":      s.now().Add(time.Duration(minutes) * time.Minute).In(demoZone).Format(time.RFC3339),
		"message":                   fmt.Sprintf("催件工单已提交给%s，预计 %d 分钟内回复。如需加急请致电 %s。", team, minutes, c.Hotline),
	}
	if haveOrder {
		out["order_id"] = o.ID
		out["order_status"] = o.Status
	}
	if tracking != "" {
		out["tracking_number"] = tracking
	}
	if reason != "" {
		out["reason"] = reason
	}
	return out, nil
}
