package demotools

import (
	"fmt"
	"net/http"
	"unicode/utf8"
)

// The shop of seed 003 §2.4 and §3.4: inventory_query answers a store's stock, and sample_send
// sends a sample with a carrier — what a person's remembered location and shipping preference
// fill in.

// inventorySKUs are the products a store stocks.
var inventorySKUs = []string{"AirPods Pro", "iPhone 16", "MacBook Air", "Apple Watch"}

// inventoryQuery answers the stock of a store (store required; city, district and sku
// optional): derived from the store's name alone.
func (s *server) inventoryQuery(_ *http.Request, a args) (any, error) {
	fields := map[string]string{}
	for _, f := range []string{"city", "district", "store", "sku"} {
		v, ok, err := a.str(f)
		if err != nil {
			return nil, err
		}
		if ok && utf8.RuneCountInString(v) > 64 {
			return nil, badArg(f, "at most 64 characters", "too long")
		}
		fields[f] = v
	}
	if fields["store"] == "" {
		return nil, missingArg("store", "the store's name, e.g. \"三里屯店\"")
	}
	var stock []map[string]any
	for _, sku := range inventorySKUs {
		if fields["sku"] != "" && fields["sku"] != sku {
			continue
		}
		r := seeded("inventory", fields["city"], fields["store"], sku)
		stock = append(stock, map[string]any{"sku": sku, "available": between(r, 0, 40)})
	}
	where := fields["city"] + fields["district"] + fields["store"]
	return map[string]any{"city": fields["city"], "district": fields["district"], "store": fields["store"], "stock": stock,
		"summary": fmt.Sprintf("%s: %d products in stock", where, len(stock))}, nil
}

// sampleCarriers are the carriers sample_send ships with.
var sampleCarriers = map[string]bool{"SF-Express": true, "YTO": true, "ZTO": true, "EMS": true, "JD": true}

// sampleSend ships a sample (sku, default "sample kit") with shipping_carrier (required, one
// of sampleCarriers).
func (s *server) sampleSend(_ *http.Request, a args) (any, error) {
	carrier, ok, err := a.str("shipping_carrier")
	if err != nil {
		return nil, err
	}
	if !ok || carrier == "" {
		return nil, missingArg("shipping_carrier", "the carrier: SF-Express, YTO, ZTO, EMS or JD")
	}
	if !sampleCarriers[carrier] {
		return nil, badArg("shipping_carrier", "SF-Express, YTO, ZTO, EMS or JD", fmt.Sprintf("%q is none of them", carrier))
	}
	sku, _, err := a.str("sku")
	if err != nil {
		return nil, err
	}
	if sku == "" {
		sku = "sample kit"
	}
	if utf8.RuneCountInString(sku) > 64 {
		return nil, badArg("sku", "at most 64 characters", "too long")
	}
	r := seeded("sample", carrier, sku, s.today().Format(dateLayout))
	return map[string]any{"shipment_id": fmt.Sprintf("SMP%08d", between(r, 0, 99999999)), "sku": sku, "shipping_carrier": carrier,
		"status": "created"}, nil
}
