package prefilter

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The seed's office tools (seed 001 §2.2, §5.2): twenty, of which a message is about two or
// three.
func office() []Tool {
	return []Tool{
		{Name: "meeting_book", Description: "预订会议室并创建会议，邀请参与者", Args: []Arg{{"room_id", "会议室ID"}, {"title", "会议主题"}, {"start_time", "开始时间"}}},
		{Name: "room_search", Description: "按时间和人数查找空闲的会议室", Args: []Arg{{"date", "日期"}, {"capacity", "人数"}}},
		{Name: "calendar_free_slots", Description: "查询某位参与者在指定日期的空闲时间段", Args: []Arg{{"user_id", "参与者ID"}, {"date", "日期，格式YYYY-MM-DD"}}},
		{Name: "notify_send", Description: "向指定用户发送会议通知", Args: []Arg{{"user_ids", "接收人ID列表"}, {"message", "通知内容"}}},
		{Name: "weather_search", Description: "查询指定城市的天气", Args: []Arg{{"city", "城市"}}},
		{Name: "order_query", Description: "查询订单详情与物流状态", Args: []Arg{{"order_id", "订单号"}}},
		{Name: "logistics_urge", Description: "催促物流派送", Args: []Arg{{"order_id", "订单号"}}},
		{Name: "get_policy_number", Description: "查询客户的保单号", Args: []Arg{{"name", "客户姓名"}}},
		{Name: "get_policy_status", Description: "查询保单的状态", Args: []Arg{{"policy_id", "保单号"}}},
		{Name: "get_customer_profile", Description: "查询客户的资料", Args: []Arg{{"customer_id", "客户编号"}}},
		{Name: "expense_submit", Description: "提交报销单", Args: []Arg{{"amount", "金额"}}},
		{Name: "leave_apply", Description: "申请休假", Args: []Arg{{"days", "天数"}}},
		{Name: "payroll_query", Description: "查询工资条", Args: []Arg{{"month", "月份"}}},
		{Name: "ticket_create", Description: "创建IT工单", Args: []Arg{{"summary", "问题描述"}}},
		{Name: "vpn_reset", Description: "重置VPN密码", Args: []Arg{{"user_id", "员工ID"}}},
		{Name: "translate_text", Description: "把文本翻译成指定语言", Args: []Arg{{"text", "文本"}, {"target", "目标语言"}}},
		{Name: "doc_search", Description: "搜索公司文档库", Args: []Arg{{"query", "关键词"}}},
		{Name: "flight_book", Description: "预订机票", Args: []Arg{{"from", "出发城市"}, {"to", "到达城市"}, {"date", "日期"}}},
		{Name: "hotel_book", Description: "预订酒店", Args: []Arg{{"city", "城市"}, {"nights", "晚数"}}},
		{Name: "echo", Description: "Echoes its arguments back", Args: []Arg{{"delay_ms", ""}}},
	}
}

func names(cs []Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// The seed's decision log: "帮我定明天下午的会议室" narrows twenty tools to the meeting room's.
func TestTheSeedsMessageNarrowsToItsTools(t *testing.T) {
	ix := New(office())
	got := ix.Rank("帮我定明天下午的会议室", 3, 0)
	if n := names(got); len(n) != 3 || !slices.Contains(n, "meeting_book") || !slices.Contains(n, "room_search") {
		t.Fatalf("%v", got)
	}
	t.Logf("[路由] 粗筛候选: %v", got)
	for msg, want := range map[string]string{
		"上海明天的天气怎么样":                  "weather_search",
		"我的订单到哪了":                     "order_query",
		"查一下我的保单号":                    "get_policy_number",
		"what's the weather in Paris": "weather_search",
		"book a meeting room":         "meeting_book",
	} {
		if got := ix.Rank(msg, 1, 0); len(got) != 1 || got[0].Name != want {
			t.Errorf("%s: %v, want %s", msg, got, want)
		}
	}
}

// Nothing qualifies: an empty list, never all the tools.
func TestNothingQualifies(t *testing.T) {
	ix := New(office())
	if got := ix.Rank("zzz qqq", 3, 0); len(got) != 0 {
		t.Errorf("%v", got)
	}
	if got := ix.Rank("帮我定明天下午的会议室", 3, 1000); len(got) != 0 {
		t.Errorf("above the threshold: %v", got)
	}
	if got := New(nil).Rank("anything", 3, 0); len(got) != 0 {
		t.Errorf("no tools: %v", got)
	}
}

// The same message, however written, is one cache entry; another tool set is another version.
func TestCacheAndVersion(t *testing.T) {
	ix := New(office())
	a := ix.Rank("  帮我定明天下午的  会议室 ", 3, 0)
	b := ix.Rank("帮我定明天下午的 会议室", 3, 0)
	if fmt.Sprint(a) != fmt.Sprint(b) || ix.cache.len() != 1 {
		t.Errorf("%v %v, %d cached", a, b, ix.cache.len())
	}
	for i := range CacheSize + 10 {
		ix.Rank(fmt.Sprint("message ", i), 3, 0)
	}
	if ix.cache.len() != CacheSize || len(ix.cache.m) != CacheSize {
		t.Errorf("cache holds %d", ix.cache.len())
	}
	if New(office()).Version() != ix.Version() || New(office()[1:]).Version() == ix.Version() {
		t.Error("versions")
	}
}

func TestTokens(t *testing.T) {
	got := strings.Join(Tokens("Meeting_Book 会议室 ＡＢＣ 天"), "|")
	if got != "meeting_book|meeting|book|会议|议室|abc|天" {
		t.Errorf("%s", got)
	}
}

func FuzzRank(f *testing.F) {
	f.Add("帮我定明天下午的会议室")
	f.Add("\xff\xfe")
	f.Add(strings.Repeat("会", 10000))
	ix := New(office())
	f.Fuzz(func(t *testing.T, msg string) {
		got := ix.Rank(msg, 3, 0)
		if len(got) > 3 {
			t.Fatal(got)
		}
		for i := 1; i < len(got); i++ {
			if got[i].Score > got[i-1].Score {
				t.Fatal(got)
			}
		}
	})
}

// 200 tools (the office's, ten times over, with numbered names): a cache miss and a hit.
func tools200() []Tool {
	var out []Tool
	for i := range 10 {
		for _, t := range office() {
			t.Name = fmt.Sprintf("%s_%d", t.Name, i)
			out = append(out, t)
		}
	}
	return out
}

// percentiles runs do b.N times and reports its p50 and p99 in µs.
func percentiles(b *testing.B, do func(i int)) {
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		do(i)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1000, "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1000, "p99-µs")
}

func BenchmarkRankMiss(b *testing.B) {
	ix := New(tools200())
	percentiles(b, func(i int) {
		// Each message another (the cache never holds it).
		ix.Rank(fmt.Sprintf("帮我定明天下午的会议室，参会%d人，顺便通知张伟", i), 3, 0)
	})
}

func BenchmarkRankHit(b *testing.B) {
	ix := New(tools200())
	ix.Rank("帮我定明天下午的会议室", 3, 0)
	percentiles(b, func(int) { ix.Rank("帮我定明天下午的会议室", 3, 0) })
}

// The cache keeps the best CacheTop of a message, however many tools match: a message that
// matches all of many tools costs a bounded entry.
func TestTheCacheKeepsTheBest(t *testing.T) {
	var many []Tool
	for i := range 500 {
		many = append(many, Tool{Name: fmt.Sprint("tool_", i), Description: "查询会议"})
	}
	ix := New(many)
	if got := ix.Rank("查询会议", 3, 0); len(got) != 3 {
		t.Fatal(got)
	}
	if top, _ := ix.cache.get(Normalize("查询会议")); len(top) != CacheTop {
		t.Errorf("cached %d candidates", len(top))
	}
	if got := ix.Rank("查询会议", 0, 0); len(got) != 500 {
		t.Errorf("all: %d", len(got))
	}
}
