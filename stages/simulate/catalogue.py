"""The embedded default judged set: an invented home-improvement catalogue and graded queries.

Everything here is written by the project (invented brands, templated titles, labels from a
simulated three-rater panel), so the main job runs out of the box without licensed data. Queries
are what users type, not title words: colloquial names, brand-only and partial queries, typos and
shuffled word order at the documented RATES, while the raters grade the intent behind the query. The
shipped CSV `dssm/data/default_catalogue.csv` is this module's output; regenerate it with
`python -m stages.simulate.catalogue` (a test checks that the two agree). Its header matches Home Depot's,
so the default judged-set options read it unchanged.
"""

from __future__ import annotations

import csv
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from core.judgments import DEFAULT_CATALOGUE

HEADER = ["id", "product_uid", "product_title", "search_term", "relevance"]

BRANDS = [
    "Ardent",
    "Brisco",
    "Corvell",
    "Dunmore",
    "Eastline",
    "Fairhaven",
    "Granton",
    "Holloway",
    "Ironvale",
    "Juniper",
    "Kestrel",
    "Larkspur",
    "Merriton",
    "Northgate",
    "Oakhurst",
    "Pemberly",
]

# family -> (product nouns, attribute slots); each slot is a list of alternatives.
FAMILIES: dict[str, tuple[list[str], list[list[str]]]] = {
    "drill": (
        ["Cordless Drill", "Hammer Drill", "Drill Driver"],
        [["12-Volt", "18-Volt", "20-Volt"], ["Brushless", "Compact", "Heavy Duty"], ["Kit", "Tool Only"]],
    ),
    "saw": (
        ["Circular Saw", "Miter Saw", "Jig Saw", "Reciprocating Saw"],
        [["7-1/4 in.", "10 in.", "12 in."], ["Corded", "Cordless"], ["with Laser Guide", "with Blade"]],
    ),
    "paint": (
        ["Interior Paint", "Exterior Paint", "Paint and Primer"],
        [
            ["1 gal.", "5 gal.", "Quart"],
            ["Flat", "Eggshell", "Satin", "Semi-Gloss"],
            ["White", "Gray", "Navy Blue", "Beige"],
        ],
    ),
    "faucet": (
        ["Kitchen Faucet", "Bathroom Faucet", "Pull-Down Faucet"],
        [["Single-Handle", "Two-Handle"], ["Chrome", "Brushed Nickel", "Matte Black"], ["with Sprayer", "Lead-Free"]],
    ),
    "showerhead": (
        ["Shower Head", "Rain Shower Head", "Handheld Shower"],
        [
            ["5-Spray", "3-Spray", "Single-Spray"],
            ["Chrome", "Brushed Nickel", "Oil Rubbed Bronze"],
            ["8 in.", "6 in.", "2.5 GPM"],
        ],
    ),
    "toilet": (
        ["Toilet", "Elongated Toilet", "Round Toilet"],
        [["One-Piece", "Two-Piece"], ["1.28 GPF", "1.6 GPF", "Dual Flush"], ["White", "Biscuit"]],
    ),
    "bulb": (
        ["LED Light Bulb", "Flood Light Bulb", "Edison Bulb"],
        [
            ["60-Watt Equivalent", "100-Watt Equivalent", "40-Watt Equivalent"],
            ["Soft White", "Daylight", "Bright White"],
            ["A19", "BR30", "4-Pack", "8-Pack"],
        ],
    ),
    "ceilingfan": (
        ["Ceiling Fan", "Outdoor Ceiling Fan", "Ceiling Fan with Light"],
        [
            ["52 in.", "44 in.", "60 in."],
            ["Brushed Nickel", "Matte Black", "White", "Bronze"],
            ["with Remote", "Indoor/Outdoor"],
        ],
    ),
    "lumber": (
        ["Pressure-Treated Lumber", "Pine Board", "Cedar Board", "Stud"],
        [
            ["2 in. x 4 in.", "2 in. x 6 in.", "1 in. x 6 in.", "4 in. x 4 in."],
            ["8 ft.", "10 ft.", "12 ft."],
            ["Ground Contact", "Kiln-Dried"],
        ],
    ),
    "screws": (
        ["Deck Screws", "Wood Screws", "Drywall Screws"],
        [
            ["#8 x 2-1/2 in.", "#9 x 3 in.", "#6 x 1-5/8 in."],
            ["Star Drive", "Phillips"],
            ["1 lb. Box", "5 lb. Box", "Exterior Coated"],
        ],
    ),
    "tile": (
        ["Porcelain Floor Tile", "Ceramic Wall Tile", "Subway Tile"],
        [
            ["12 in. x 24 in.", "3 in. x 6 in.", "18 in. x 18 in."],
            ["Matte", "Glossy"],
            ["White", "Gray", "Marble Look", "Wood Look"],
        ],
    ),
    "flooring": (
        ["Vinyl Plank Flooring", "Laminate Flooring", "Engineered Hardwood"],
        [["Waterproof", "Click Lock"], ["Oak", "Hickory", "Maple", "Walnut"], ["12 mm", "8 mm", "20 sq. ft./case"]],
    ),
    "mower": (
        ["Lawn Mower", "Push Mower", "Riding Mower"],
        [["Gas", "Electric", "Battery"], ["21 in.", "42 in.", "20 in."], ["Self-Propelled", "Mulching"]],
    ),
    "trimmer": (
        ["String Trimmer", "Hedge Trimmer", "Edger"],
        [["Cordless", "Gas", "Electric"], ["40-Volt", "20-Volt", "2-Cycle"], ["Straight Shaft", "Curved Shaft"]],
    ),
    "grill": (
        ["Gas Grill", "Charcoal Grill", "Pellet Grill"],
        [["3-Burner", "4-Burner", "22 in."], ["Stainless Steel", "Black"], ["with Side Burner", "with Cover"]],
    ),
    "patio": (
        ["Patio Dining Set", "Patio Chair", "Outdoor Sectional"],
        [["4-Piece", "5-Piece", "7-Piece"], ["Wicker", "Aluminum", "Teak"], ["with Cushions", "Stackable"]],
    ),
    "vanity": (
        ["Bathroom Vanity", "Vanity Cabinet", "Vanity with Top"],
        [["30 in.", "36 in.", "48 in.", "60 in."], ["White", "Espresso", "Gray"], ["Single Sink", "Double Sink"]],
    ),
    "door": (
        ["Front Door", "Interior Door", "Patio Door", "Storm Door"],
        [
            ["36 in. x 80 in.", "32 in. x 80 in.", "30 in. x 80 in."],
            ["Fiberglass", "Steel", "Solid Core", "Hollow Core"],
            ["Prehung", "Slab"],
        ],
    ),
    "lock": (
        ["Deadbolt", "Smart Lock", "Door Knob", "Lever Handle"],
        [
            ["Satin Nickel", "Matte Black", "Polished Brass"],
            ["Keyed", "Keypad", "Privacy"],
            ["Single Cylinder", "Double Cylinder"],
        ],
    ),
    "hose": (
        ["Garden Hose", "Soaker Hose", "Expandable Hose"],
        [["5/8 in.", "1/2 in."], ["50 ft.", "75 ft.", "100 ft."], ["Heavy Duty", "Kink Resistant"]],
    ),
    "insulation": (
        ["Fiberglass Insulation", "Foam Board Insulation", "Spray Foam"],
        [["R-13", "R-19", "R-30"], ["15 in. x 93 in.", "4 ft. x 8 ft.", "12 oz."], ["Kraft Faced", "Unfaced"]],
    ),
    "ladder": (
        ["Step Ladder", "Extension Ladder", "Multi-Position Ladder"],
        [["6 ft.", "8 ft.", "24 ft.", "17 ft."], ["Fiberglass", "Aluminum"], ["Type IA", "Type II", "250 lb. Load"]],
    ),
    "storage": (
        ["Storage Cabinet", "Garage Shelving", "Tool Chest"],
        [["5-Shelf", "4-Shelf", "8-Drawer"], ["Steel", "Resin", "Wood"], ["72 in.", "48 in.", "Black", "Gray"]],
    ),
    "outlet": (
        ["Outlet", "GFCI Outlet", "USB Outlet", "Light Switch"],
        [
            ["15 Amp", "20 Amp"],
            ["White", "Ivory", "Light Almond"],
            ["Tamper Resistant", "Weather Resistant", "10-Pack"],
        ],
    ),
    "wire": (
        ["Electrical Wire", "Romex Cable", "Extension Cord"],
        [["12/2", "14/2", "10/3"], ["25 ft.", "50 ft.", "250 ft."], ["Solid", "Stranded", "Outdoor"]],
    ),
    "caulk": (
        ["Silicone Caulk", "Construction Adhesive", "Wood Glue"],
        [
            ["10.1 oz.", "2.8 oz.", "16 oz."],
            ["Clear", "White", "Almond"],
            ["Kitchen and Bath", "Waterproof", "Paintable"],
        ],
    ),
    "fence": (
        ["Fence Panel", "Fence Post", "Vinyl Fence", "Chain Link Fence"],
        [
            ["6 ft. x 8 ft.", "4 ft. x 50 ft.", "4 in. x 4 in."],
            ["Cedar", "Pressure-Treated", "White Vinyl", "Galvanized"],
            ["Dog Ear", "Privacy"],
        ],
    ),
    "mulch": (
        ["Mulch", "Potting Soil", "Garden Soil", "Lawn Fertilizer"],
        [["2 cu. ft.", "1.5 cu. ft.", "40 lb."], ["Brown", "Red", "Black", "Organic"], ["All Purpose", "Weed Control"]],
    ),
    "heater": (
        ["Water Heater", "Tankless Water Heater", "Space Heater"],
        [["40 gal.", "50 gal.", "1500-Watt"], ["Gas", "Electric", "Natural Gas"], ["6-Year Warranty", "Indoor"]],
    ),
    "blinds": (
        ["Window Blinds", "Cordless Blinds", "Roller Shade", "Curtain Rod"],
        [
            ["35 in. x 64 in.", "23 in. x 64 in.", "72 in."],
            ["White", "Light Filtering", "Blackout"],
            ["Faux Wood", "Vinyl", "Cut to Size"],
        ],
    ),
}

# What users call a product when they do not use the catalogue's words: colloquial names, trade
# names and synonyms (a name sharing a word with the target's title is skipped for that query).
COLLOQUIAL: dict[str, list[str]] = {
    "Cordless Drill": ["screw gun", "battery screwdriver"],
    "Hammer Drill": ["masonry driller", "rotary hammer"],
    "Drill Driver": ["screw gun", "power screwdriver"],
    "Circular Saw": ["skilsaw", "buzz cutter"],
    "Miter Saw": ["chop box", "mitre cutter"],
    "Jig Saw": ["scroll cutter", "jigsaw"],
    "Reciprocating Saw": ["sawzall", "demolition cutter"],
    "Interior Paint": ["wall emulsion", "room coating"],
    "Exterior Paint": ["house coating", "siding emulsion"],
    "Paint and Primer": ["one coat emulsion", "wall coating"],
    "Kitchen Faucet": ["sink tap", "mixer tap"],
    "Bathroom Faucet": ["basin tap", "lavatory tap"],
    "Pull-Down Faucet": ["sprayer tap", "pulldown tap"],
    "Shower Head": ["showerhead", "bath sprinkler"],
    "Rain Shower Head": ["rainfall showerhead", "ceiling sprinkler"],
    "Handheld Shower": ["hand sprayer", "wand showerhead"],
    "Toilet": ["commode", "water closet"],
    "Elongated Toilet": ["comfort commode", "oval commode"],
    "Round Toilet": ["compact commode", "round bowl commode"],
    "LED Light Bulb": ["lightbulb", "lamp globe"],
    "Flood Light Bulb": ["floodlight", "spotlight lamp"],
    "Edison Bulb": ["vintage filament lamp", "filament lightbulb"],
    "Ceiling Fan": ["air circulator", "paddle fan"],
    "Outdoor Ceiling Fan": ["porch fan", "patio paddle fan"],
    "Ceiling Fan with Light": ["fan light combo", "lighted paddle fan"],
    "Pressure-Treated Lumber": ["treated wood", "green timber"],
    "Pine Board": ["pine plank", "softwood plank"],
    "Cedar Board": ["cedar plank", "cedar timber"],
    "Stud": ["two by four", "framing timber"],
    "Deck Screws": ["decking fasteners", "outdoor fasteners"],
    "Wood Screws": ["timber fasteners", "woodscrews"],
    "Drywall Screws": ["sheetrock fasteners", "gypsum fasteners"],
    "Porcelain Floor Tile": ["floor squares", "porcelain pavers"],
    "Ceramic Wall Tile": ["backsplash squares", "wall cladding"],
    "Subway Tile": ["backsplash", "metro brick tiles"],
    "Vinyl Plank Flooring": ["lvp", "luxury vinyl"],
    "Laminate Flooring": ["floorboards", "laminated planks"],
    "Engineered Hardwood": ["wood floors", "hardwood floors"],
    "Lawn Mower": ["lawnmower", "grass cutter"],
    "Push Mower": ["walk behind lawnmower", "reel cutter"],
    "Riding Mower": ["lawn tractor", "ride on lawnmower"],
    "String Trimmer": ["weed eater", "weed whacker"],
    "Hedge Trimmer": ["bush cutter", "shrub shears"],
    "Edger": ["lawn edging tool", "sidewalk edging tool"],
    "Gas Grill": ["bbq", "propane barbecue"],
    "Charcoal Grill": ["kettle bbq", "charcoal barbecue"],
    "Pellet Grill": ["pellet smoker", "wood fired smoker"],
    "Patio Dining Set": ["garden table and chairs", "outdoor dinette"],
    "Patio Chair": ["lawn chair", "deck chair"],
    "Outdoor Sectional": ["garden sofa", "patio couch"],
    "Bathroom Vanity": ["washstand", "sink cabinet"],
    "Vanity Cabinet": ["washstand", "bath sink base"],
    "Vanity with Top": ["washstand with countertop", "bath sink console"],
    "Front Door": ["entry door", "entrance door"],
    "Interior Door": ["bedroom door", "passage door"],
    "Patio Door": ["sliding glass door", "french doors"],
    "Storm Door": ["screen door", "glass outer door"],
    "Deadbolt": ["door lock", "bolt lock"],
    "Smart Lock": ["keyless entry", "wifi lock"],
    "Door Knob": ["doorknob", "knob set"],
    "Lever Handle": ["door lever", "lever set"],
    "Garden Hose": ["water hose", "watering pipe"],
    "Soaker Hose": ["drip line", "weeper pipe"],
    "Expandable Hose": ["pocket hose", "stretch watering pipe"],
    "Fiberglass Insulation": ["pink batts", "attic batting"],
    "Foam Board Insulation": ["rigid foam", "styrofoam sheets"],
    "Spray Foam": ["great stuff", "gap filler foam"],
    "Step Ladder": ["stepladder", "step stool"],
    "Extension Ladder": ["extending ladder", "roof ladder"],
    "Multi-Position Ladder": ["folding ladder", "articulating ladder"],
    "Storage Cabinet": ["utility cupboard", "garage cupboard"],
    "Garage Shelving": ["shelves", "shelf rack"],
    "Tool Chest": ["toolbox", "mechanic chest"],
    "Outlet": ["receptacle", "wall socket"],
    "GFCI Outlet": ["gfi receptacle", "bathroom socket"],
    "USB Outlet": ["usb receptacle", "charging socket"],
    "Light Switch": ["wall switch", "toggle switch"],
    "Electrical Wire": ["house wiring", "copper wiring"],
    "Romex Cable": ["nm wire", "house wiring"],
    "Extension Cord": ["power lead", "drop cord"],
    "Silicone Caulk": ["sealant", "bathtub sealer"],
    "Construction Adhesive": ["liquid nails", "panel glue"],
    "Wood Glue": ["carpenters glue", "pva"],
    "Fence Panel": ["fencing section", "privacy screen"],
    "Fence Post": ["fencing post", "corner post"],
    "Vinyl Fence": ["pvc fencing", "plastic fencing"],
    "Chain Link Fence": ["cyclone fencing", "wire mesh fencing"],
    "Mulch": ["bark chips", "wood chips"],
    "Potting Soil": ["potting mix", "container compost"],
    "Garden Soil": ["topsoil", "planting compost"],
    "Lawn Fertilizer": ["weed and feed", "grass food"],
    "Water Heater": ["hot water tank", "boiler tank"],
    "Tankless Water Heater": ["on demand boiler", "instant hot water"],
    "Space Heater": ["portable radiator", "room warmer"],
    "Window Blinds": ["shades", "window coverings"],
    "Cordless Blinds": ["cordfree shades", "child safe shades"],
    "Roller Shade": ["roll up blind", "pull down blind"],
    "Curtain Rod": ["drapery rod", "curtain pole"],
}

# Query surface forms and how often each is applied (independently, to the intent's words); the
# rates are documented in docs/simulator.md and `python -m stages.simulate.catalogue --stats` measures them.
RATES = {
    "colloquial": 0.30,  # the product is named by a COLLOQUIAL name instead of its noun
    "brand_only": 0.05,  # the query is a brand name alone
    "misspelled": 0.20,  # one word carries a typo (the paper's logs: about 20% misspelled queries)
    "partial": 0.08,  # the last word is cut short (typed and submitted mid-word)
    "reordered": 0.15,  # the words are shuffled
    "informal": 0.30,  # a unit or finish written informally (in. -> inch, nickel -> nickle)
}
INFORMAL = {"in.": "inch", "ft.": "ft", "gal.": "gallon", "-volt": " volt", "brushed nickel": "brushed nickle"}
KEYBOARD = "qwertyuiopasdfghjklzxcvbnm"


@dataclass(frozen=True)
class Product:
    uid: int
    family: str
    noun: str
    attrs: tuple[str, ...]
    brand: str

    @property
    def title(self) -> str:
        middle = " ".join(self.attrs[:-1])
        return f"{self.brand} {middle} {self.noun} {self.attrs[-1]}".replace("  ", " ")


@dataclass(frozen=True)
class Intent:
    """What the user wants, which the raters grade against; the query text is only its surface."""

    family: str
    noun: str  # the product noun wanted ("" for a brand-only query)
    facets: frozenset[str]  # attribute values named, lower-case
    brand: str  # the brand named, lower-case, or ""


def _products(rng: random.Random, per_family: int) -> list[Product]:
    products, uid = [], 200001
    for family, (nouns, slots) in FAMILIES.items():
        seen = set()
        while len([p for p in products if p.family == family]) < per_family:
            candidate = (rng.choice(nouns), tuple(rng.choice(s) for s in slots), rng.choice(BRANDS))
            if candidate in seen:
                continue
            seen.add(candidate)
            products.append(Product(uid, family, candidate[0], candidate[1], candidate[2]))
            uid += 1
    return products


def _typo(rng: random.Random, word: str) -> str:
    """One keyboard slip: a letter dropped, doubled, swapped with the next, or replaced."""
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(4)
    if kind == 0:
        return word[:i] + word[i + 1 :]
    if kind == 1:
        return word[:i] + word[i] + word[i:]
    if kind == 2:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + rng.choice(KEYBOARD.replace(word[i], "")) + word[i + 1 :]


def _query_for(rng: random.Random, product: Product) -> tuple[str, Intent, set[str]]:
    """A query from a user who wants something like `product`: its text, the intent behind it, and
    which surface forms (RATES' keys) shaped the text."""
    forms: set[str] = set()
    if rng.random() < RATES["brand_only"]:
        forms.add("brand_only")
        text = product.brand.lower()
        return text, Intent(product.family, "", frozenset(), text), forms
    noun_words = product.noun.split()
    head = " ".join(noun_words[-rng.randint(1, len(noun_words)) :])
    title_words = set(product.title.lower().split())
    names = [c for c in COLLOQUIAL[product.noun] if not set(c.split()) & title_words]
    if names and rng.random() < RATES["colloquial"]:
        forms.add("colloquial")
        head = rng.choice(names)
    facets = [a for a in product.attrs if rng.random() < 0.35]
    brand = product.brand if rng.random() < 0.15 else ""
    intent = Intent(product.family, product.noun, frozenset(f.lower() for f in facets), brand.lower())
    text = " ".join([*facets, brand, head]).lower().split()
    text = " ".join(text)
    for formal, informal in INFORMAL.items():
        if formal in text and rng.random() < RATES["informal"]:
            text = text.replace(formal, informal)
            forms.add("informal")
    tokens = text.split()
    if len(tokens) > 1 and rng.random() < RATES["reordered"]:
        shuffled = tokens[:]
        while shuffled == tokens:
            rng.shuffle(shuffled)
        tokens = shuffled
        forms.add("reordered")
    long_words = [i for i, w in enumerate(tokens) if len(w) >= 4 and w.isalpha()]
    if long_words and rng.random() < RATES["misspelled"]:
        i = rng.choice(long_words)
        tokens[i] = _typo(rng, tokens[i])
        forms.add("misspelled")
    if len(tokens[-1]) >= 5 and tokens[-1].isalpha() and rng.random() < RATES["partial"]:
        tokens[-1] = tokens[-1][: rng.randint(3, len(tokens[-1]) - 2)]
        forms.add("partial")
    return " ".join(tokens), intent, forms


def _rater_score(rng: random.Random, intent: Intent, product: Product) -> int:
    """One crowd rater's 1..3 grade of `product` for the intent (not the query's words): right
    family and noun, the named facets and brand matched."""
    if not intent.noun:  # brand only: the brand's products are what was asked for
        base = 2.6 if product.brand.lower() == intent.brand else 1.2
        return max(1, min(3, round(base + rng.gauss(0.0, 0.45))))
    if product.family != intent.family:
        base = 1.0
    else:
        attrs = {a.lower() for a in product.attrs}
        named = list(intent.facets) + ([intent.brand] if intent.brand else [])
        brand_matched = bool(intent.brand) and product.brand.lower() == intent.brand
        matched = sum(f in attrs for f in intent.facets) + brand_matched
        base = 1.8 + (0.7 if product.noun == intent.noun else 0.0) + (0.5 * matched / len(named) if named else 0.5)
        base -= 0.4 * (len(named) - matched)
    return max(1, min(3, round(base + rng.gauss(0.0, 0.45))))


def generate(seed: int = 7, per_family: int = 40, queries_per_family: int = 22) -> list[list[str]]:
    """Rows of the default judged set, in Home Depot's column order."""
    return [row for row, _ in _generate(seed, per_family, queries_per_family)]


def _generate(seed: int, per_family: int, queries_per_family: int) -> list[tuple[list[str], set[str]]]:
    rng = random.Random(seed)
    products = _products(rng, per_family)
    by_family: dict[str, list[Product]] = {}
    for p in products:
        by_family.setdefault(p.family, []).append(p)
    rows, seen_queries, row_id = [], set(), 1
    for family, members in by_family.items():
        made = 0
        while made < queries_per_family:
            target = rng.choice(members)
            query, intent, forms = _query_for(rng, target)
            if query in seen_queries:
                continue
            seen_queries.add(query)
            made += 1
            same = rng.sample(members, k=min(len(members), rng.randint(4, 9)))
            other_families = [f for f in by_family if f != family]
            others = [rng.choice(by_family[rng.choice(other_families)]) for _ in range(rng.randint(1, 3))]
            if intent.brand and not intent.noun:  # brand only: candidates from several families
                others += [p for p in rng.sample(products, 40) if p.brand.lower() == intent.brand][:3]
            judged = list(dict.fromkeys([target, *same, *others]))
            rng.shuffle(judged)
            for product in judged:
                grades = [_rater_score(rng, intent, product) for _ in range(3)]
                label = round(sum(grades) / 3, 2)
                rows.append(([str(row_id), str(product.uid), product.title, query, f"{label:g}"], forms))
                row_id += 1
    return rows


def stats(seed: int = 7) -> dict[str, float]:
    """The share of queries shaped by each surface form, and of queries sharing no word with any
    of their judged titles."""
    queries: dict[str, tuple[set[str], set[str]]] = {}
    for row, forms in _generate(seed, 40, 22):
        words, _ = queries.setdefault(row[3], (set(), forms))
        words.update(row[2].lower().split())
    n = len(queries)
    shares = {form: sum(form in f for _, f in queries.values()) / n for form in RATES}
    no_overlap = sum(not set(q.split()) & words for q, (words, _) in queries.items()) / n
    return {"queries": n, **shares, "no_word_in_any_judged_title": no_overlap}


def write(path: Path = DEFAULT_CATALOGUE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="latin-1", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(generate())
    return path


if __name__ == "__main__":
    if sys.argv[1:] == ["--stats"]:
        for key, value in stats().items():
            print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    else:
        print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CATALOGUE))
