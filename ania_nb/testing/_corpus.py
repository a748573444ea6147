"""Distractor chunks for knowledge-base tests and benches at scale: generated Chinese and English.

Deterministic (one seed gives the same texts on every machine). Each chunk is about one of
``len(DOMAINS)`` domains beside the topics of bench/data/knowledge_set.json (logistics,
insurance, football, …), so its vectors form clusters as real collections do; half the chunks
are Chinese. One in four carries a unique code (``ZQ-30417``): a query naming it tests the path
of "exact" queries, whose answer a vector may not place.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# domain: (English nouns, English verb phrases, Chinese nouns, Chinese verb phrases)
DOMAINS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "logistics": (
        ("container", "pallet", "warehouse", "forklift", "freight invoice", "customs form"),
        ("is loaded onto", "is scanned at", "delays", "is routed through"),
        ("集装箱", "托盘", "仓库", "叉车", "运费单", "报关单"),
        ("被装上", "在入口扫描", "延误了", "经过"),
    ),
    "insurance": (
        ("claim", "premium", "deductible", "policyholder", "adjuster", "coverage limit"),
        ("is reviewed by", "raises", "excludes", "is settled with"),
        ("理赔", "保费", "免赔额", "投保人", "定损员", "保额上限"),
        ("由专人审核", "提高了", "不包括", "最终结清了"),
    ),
    "football": (
        ("striker", "goalkeeper", "offside rule", "penalty kick", "midfield", "corner"),
        ("beats", "is coached on", "decides", "pressures"),
        ("前锋", "守门员", "越位规则", "点球", "中场", "角球"),
        ("突破了", "专门练习", "决定了", "逼抢"),
    ),
    "chess": (
        ("opening", "endgame", "bishop pair", "pawn structure", "castling", "knight fork"),
        ("weakens", "is prepared against", "wins", "controls"),
        ("开局", "残局", "双象", "兵形", "王车易位", "马的双击"),
        ("削弱了", "针对性地准备", "赢得", "控制着"),
    ),
    "woodworking": (
        ("dovetail joint", "chisel", "hand plane", "oak board", "wood glue", "grain"),
        ("is sharpened for", "splits", "is clamped to", "smooths"),
        ("燕尾榫", "凿子", "刨子", "橡木板", "木工胶", "木纹"),
        ("要先磨好", "劈开了", "夹紧在", "刨平了"),
    ),
    "car repair": (
        ("brake pad", "timing belt", "spark plug", "oil filter", "alternator", "tyre"),
        ("wears out before", "is replaced with", "overheats", "squeals under"),
        ("刹车片", "正时皮带", "火花塞", "机油滤芯", "发电机", "轮胎"),
        ("提前磨损", "被换成", "过热", "发出异响"),
    ),
    "plumbing": (
        ("pipe joint", "water heater", "drain trap", "valve", "pressure gauge", "sealant tape"),
        ("leaks near", "is flushed through", "blocks", "is tightened on"),
        ("管道接头", "热水器", "存水弯", "阀门", "压力表", "生料带"),
        ("在附近漏水", "被冲洗", "堵住了", "拧紧在"),
    ),
    "birdwatching": (
        ("heron", "migration route", "binoculars", "wetland", "nesting season", "field guide"),
        ("is spotted near", "follows", "disturbs", "is recorded in"),
        ("苍鹭", "迁徙路线", "望远镜", "湿地", "筑巢季", "鸟类图鉴"),
        ("出现在", "沿着", "惊扰了", "被记录在"),
    ),
    "fishing": (
        ("fly rod", "lure", "trout stream", "fishing line", "reel", "bait"),
        ("attracts", "is cast across", "tangles", "is reeled past"),
        ("飞钓竿", "拟饵", "鳟鱼溪", "鱼线", "绕线轮", "鱼饵"),
        ("吸引了", "抛向", "缠住了", "收过"),
    ),
    "real estate": (
        ("mortgage", "down payment", "floor plan", "property tax", "lease", "appraisal"),
        ("lowers", "is negotiated with", "is registered for", "depends on"),
        ("房贷", "首付", "户型图", "房产税", "租约", "评估价"),
        ("降低了", "与对方谈妥", "办理登记", "取决于"),
    ),
    "hotels": (
        ("front desk", "room rate", "housekeeping", "booking", "check-out", "minibar"),
        ("is upgraded by", "cancels", "is charged to", "welcomes"),
        ("前台", "房价", "客房服务", "预订", "退房", "迷你吧"),
        ("被升级", "取消了", "记入", "接待了"),
    ),
    "airlines": (
        ("boarding pass", "layover", "cabin crew", "baggage allowance", "runway", "gate"),
        ("is delayed at", "is rebooked for", "exceeds", "taxis to"),
        ("登机牌", "中转", "机组人员", "行李额度", "跑道", "登机口"),
        ("在机场延误", "改签到", "超过了", "滑行到"),
    ),
    "weather": (
        ("cold front", "humidity", "typhoon", "barometer", "rainfall", "heat wave"),
        ("moves toward", "is forecast for", "brings", "breaks"),
        ("冷锋", "湿度", "台风", "气压计", "降雨量", "热浪"),
        ("向东移动", "预计影响", "带来了", "打破了"),
    ),
    "volcanoes": (
        ("magma chamber", "lava flow", "ash cloud", "crater", "tectonic plate", "eruption"),
        ("threatens", "is monitored by", "reshapes", "erupts beneath"),
        ("岩浆房", "熔岩流", "火山灰云", "火山口", "构造板块", "喷发"),
        ("威胁着", "被监测", "重塑了", "在下方爆发"),
    ),
    "marine biology": (
        ("coral reef", "plankton", "sea turtle", "kelp forest", "tide pool", "whale song"),
        ("feeds", "is bleached by", "shelters", "migrates past"),
        ("珊瑚礁", "浮游生物", "海龟", "海藻林", "潮池", "鲸歌"),
        ("养活了", "因升温白化", "庇护着", "迁徙经过"),
    ),
    "dentistry": (
        ("cavity", "root canal", "crown", "enamel", "floss", "orthodontic brace"),
        ("protects", "is filled after", "erodes", "straightens"),
        ("龋齿", "根管治疗", "牙冠", "牙釉质", "牙线", "牙套"),
        ("保护着", "补好之后", "侵蚀了", "矫正了"),
    ),
    "pharmacy": (
        ("prescription", "dosage", "side effect", "generic drug", "pill organizer", "refill"),
        ("is dispensed with", "interacts with", "reduces", "is labelled for"),
        ("处方", "剂量", "副作用", "仿制药", "药盒", "续药"),
        ("随附发放", "与之相互作用", "减轻了", "标注了"),
    ),
    "contracts": (
        ("clause", "signature", "breach", "arbitration", "liability", "termination notice"),
        ("binds", "is voided by", "limits", "is drafted for"),
        ("条款", "签字", "违约", "仲裁", "责任", "解约通知"),
        ("约束着", "因此无效", "限制了", "专门起草"),
    ),
    "recruiting": (
        ("job posting", "interview", "resume", "offer letter", "salary band", "onboarding"),
        ("attracts", "is scheduled after", "screens", "is signed before"),
        ("招聘启事", "面试", "简历", "录用通知", "薪资范围", "入职培训"),
        ("吸引了", "安排在之后", "筛选了", "在之前签署"),
    ),
    "retail": (
        ("shelf", "barcode", "stock count", "discount", "cash register", "loyalty card"),
        ("is restocked after", "is scanned by", "boosts", "is reconciled with"),
        ("货架", "条形码", "盘点", "折扣", "收银机", "会员卡"),
        ("补货之后", "被扫描", "提升了", "与之核对"),
    ),
    "textiles": (
        ("loom", "cotton yarn", "dye bath", "fabric roll", "stitch", "silk thread"),
        ("is woven into", "fades after", "is spun from", "shrinks in"),
        ("织布机", "棉纱", "染缸", "布匹", "针脚", "丝线"),
        ("织进了", "洗后褪色", "纺成", "在热水中缩水"),
    ),
    "mining": (
        ("ore deposit", "mine shaft", "drill bit", "ventilation fan", "copper vein", "blast"),
        ("is extracted from", "collapses near", "is reinforced with", "exposes"),
        ("矿床", "矿井", "钻头", "通风机", "铜矿脉", "爆破"),
        ("从中开采", "在附近坍塌", "加固了", "暴露出"),
    ),
    "railways": (
        ("timetable", "signal box", "sleeper car", "platform", "freight train", "track gauge"),
        ("is switched at", "runs late past", "connects", "is maintained by"),
        ("时刻表", "信号楼", "卧铺车厢", "站台", "货运列车", "轨距"),
        ("在此道岔切换", "晚点经过", "连接了", "由工务段维护"),
    ),
    "architecture": (
        ("facade", "load-bearing wall", "atrium", "cantilever", "blueprint", "courtyard"),
        ("supports", "is designed around", "frames", "is restored after"),
        ("外立面", "承重墙", "中庭", "悬挑", "蓝图", "庭院"),
        ("支撑着", "围绕它设计", "框出了", "修复之后"),
    ),
    "oil painting": (
        ("canvas", "palette knife", "glaze", "brushstroke", "pigment", "varnish"),
        ("is layered over", "dries on", "brightens", "is mixed with"),
        ("画布", "调色刀", "罩染", "笔触", "颜料", "上光油"),
        ("叠加在", "在上面干透", "提亮了", "与之调和"),
    ),
    "theatre": (
        ("rehearsal", "stage light", "script", "costume", "audition", "curtain call"),
        ("opens with", "is cut from", "follows", "is lit by"),
        ("排练", "舞台灯", "剧本", "戏服", "试镜", "谢幕"),
        ("以此开场", "被删掉", "紧随其后", "被照亮"),
    ),
    "fashion": (
        ("runway show", "hemline", "tailored jacket", "fabric swatch", "collection", "label"),
        ("is paired with", "defines", "is previewed at", "replaces"),
        ("时装秀", "裙摆", "修身外套", "面料小样", "系列", "品牌标签"),
        ("搭配", "定义了", "提前发布于", "取代了"),
    ),
    "wine": (
        ("vineyard", "tannin", "oak barrel", "harvest", "cork", "vintage"),
        ("is aged in", "softens", "is blended with", "ripens before"),
        ("葡萄园", "单宁", "橡木桶", "采收", "软木塞", "年份"),
        ("在其中陈酿", "变得柔和", "与之混酿", "提前成熟"),
    ),
    "beekeeping": (
        ("hive", "queen bee", "honeycomb", "smoker", "pollen", "swarm"),
        ("is inspected before", "leaves", "is fed with", "produces"),
        ("蜂箱", "蜂王", "蜂巢", "喷烟器", "花粉", "分蜂"),
        ("检查之前", "离开了", "喂食", "产出了"),
    ),
    "bicycles": (
        ("derailleur", "chain", "inner tube", "brake cable", "saddle", "spoke"),
        ("slips on", "is adjusted with", "punctures", "is trued by"),
        ("变速器", "链条", "内胎", "刹车线", "车座", "辐条"),
        ("打滑", "调整好", "扎破了", "校正了"),
    ),
    "3d printing": (
        ("nozzle", "filament", "print bed", "support structure", "layer height", "slicer"),
        ("clogs", "is leveled before", "warps on", "is exported from"),
        ("喷嘴", "耗材", "打印平台", "支撑结构", "层高", "切片软件"),
        ("堵住了", "打印前调平", "在上面翘边", "从中导出"),
    ),
    "drones": (
        ("propeller", "flight controller", "battery pack", "gimbal", "no-fly zone", "GPS lock"),
        ("stabilises", "drains during", "is calibrated for", "is banned in"),
        ("螺旋桨", "飞控", "电池组", "云台", "禁飞区", "卫星定位"),
        ("稳定了", "在飞行中耗尽", "为此校准", "被禁止"),
    ),
    "urban planning": (
        ("zoning law", "bus lane", "green belt", "housing density", "traffic light", "plaza"),
        ("reshapes", "is approved for", "connects", "reduces"),
        ("分区法规", "公交专用道", "绿化带", "住宅密度", "红绿灯", "广场"),
        ("重塑了", "获批用于", "连接了", "减少了"),
    ),
    "rice farming": (
        ("paddy field", "seedling", "irrigation canal", "harvester", "fertiliser", "terrace"),
        ("is flooded before", "is transplanted into", "boosts", "drains"),
        ("稻田", "秧苗", "灌渠", "收割机", "化肥", "梯田"),
        ("插秧前灌水", "移栽到", "提高了", "排干了"),
    ),
    "forestry": (
        ("pine stand", "firebreak", "sawmill", "seed bank", "canopy", "logging road"),
        ("is thinned before", "protects", "is replanted with", "blocks"),
        ("松树林", "防火带", "锯木厂", "种子库", "林冠", "运材道"),
        ("间伐之后", "保护着", "补种了", "挡住了"),
    ),
}

EN_TAILS = (
    "before the weekly inspection",
    "when the load is high",
    "according to the new guideline",
    "during the night shift",
    "as the manual recommends",
    "after the first month",
    "in most regions",
    "without extra cost",
    "unless the supervisor objects",
    "for the second time this year",
)
ZH_TAILS = (
    "在每周检查之前",
    "在负荷较高的时候",
    "按照新的规定",
    "在夜班期间",
    "正如手册建议的那样",
    "在第一个月之后",
    "在大多数地区",
    "并不额外收费",
    "除非主管反对",
    "这是今年第二次",
)
EN_OPENERS = ("In practice,", "Usually", "According to the team,", "Sometimes", "Often", "")
ZH_OPENERS = ("实际上，", "通常", "据团队介绍，", "有时", "往往", "")
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


@dataclass(frozen=True)
class Distractor:
    """One generated chunk: its domain, language, text and unique code (or '')."""

    domain: str
    lang: str
    title: str
    text: str
    code: str


def _sentence(rng: random.Random, domain: str, lang: str, code: str = "") -> str:
    en_n, en_v, zh_n, zh_v = DOMAINS[domain]
    if lang == "en":
        a, b = rng.sample(en_n, 2)
        opener = rng.choice(EN_OPENERS)
        subject = f"the {a}" if opener else f"The {a}"
        if code:
            subject += f" ({code})"
        words = [opener, subject, rng.choice(en_v), f"the {b}", rng.choice(EN_TAILS)]
        return " ".join(w for w in words if w) + "."
    a, b = rng.sample(zh_n, 2)
    subject = f"{a}（{code}）" if code else a
    return f"{rng.choice(ZH_OPENERS)}{subject}{rng.choice(zh_v)}{b}，{rng.choice(ZH_TAILS)}。"


def code_of(index: int, seed: int) -> str:
    """A code unique to chunk ``index`` (two letters, five digits), stable for a seed."""
    rng = random.Random(seed * 1_000_003 + index)
    return f"{rng.choice(CODE_LETTERS)}{rng.choice(CODE_LETTERS)}-{index:05d}"


def distractors(n: int, seed: int = 32) -> list[Distractor]:
    """``n`` chunks of 2–5 sentences, half Chinese, a quarter carrying a unique code."""
    rng = random.Random(seed)
    names = sorted(DOMAINS)
    found = []
    for i in range(n):
        domain = rng.choice(names)
        lang = "en" if rng.random() < 0.5 else "zh"
        code = code_of(i, seed) if rng.random() < 0.25 else ""
        count = rng.randint(2, 5)
        at = rng.randrange(count) if code else -1
        text = ("" if lang == "zh" else " ").join(
            _sentence(rng, domain, lang, code if j == at else "") for j in range(count)
        )
        title = domain if lang == "en" else DOMAINS[domain][2][0] + "笔记"
        found.append(Distractor(domain, lang, title, text, code))
    return found


def distractor_queries(n: int, seed: int = 32) -> list[tuple[str, str]]:
    """``n`` short questions (text, language) about the domains, for the overlap figure."""
    rng = random.Random(seed + 1)
    names = sorted(DOMAINS)
    queries = []
    for _ in range(n):
        domain = rng.choice(names)
        lang = "en" if rng.random() < 0.5 else "zh"
        en_n, en_v, zh_n, zh_v = DOMAINS[domain]
        if lang == "en":
            a, b = rng.sample(en_n, 2)
            queries.append((f"why {rng.choice(en_v)} the {b} and the {a}", lang))
        else:
            a, b = rng.sample(zh_n, 2)
            queries.append((f"{a}为什么{rng.choice(zh_v)}{b}", lang))
    return queries
