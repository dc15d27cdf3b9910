"""The embedded default judged set: an invented home-improvement catalogue and graded queries.

Everything here is written by the project (invented brands, templated titles, labels from a
simulated three-rater panel), so the main job runs out of the box without licensed data. The
shipped CSV `dssm/data/default_catalogue.csv` is this module's output; regenerate it with
`python -m jobs.catalogue` (a test checks that the two agree). Its header matches Home Depot's,
so the default judged-set options read it unchanged.
"""

from __future__ import annotations

import csv
import random
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CATALOGUE = Path(__file__).resolve().parent.parent / "dssm" / "data" / "default_catalogue.csv"
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

# A few informal spellings that real users type; applied to some queries.
QUERY_VARIANTS = {
    "in.": "inch",
    "ft.": "ft",
    "gal.": "gallon",
    "-Volt": " volt",
    "Brushed Nickel": "brushed nickle",
    "x": "x",
}


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


def _query_for(rng: random.Random, product: Product) -> tuple[str, set[str]]:
    """A query typed by a user who wants something like `product`, and the facets it names."""
    noun_words = product.noun.split()
    head = " ".join(noun_words[-rng.randint(1, len(noun_words)) :])
    facets = [a for a in product.attrs if rng.random() < 0.35]
    if rng.random() < 0.15:
        facets.append(product.brand)
    text = " ".join(facets + [head]).lower()
    for formal, informal in QUERY_VARIANTS.items():
        if formal.lower() in text and rng.random() < 0.3:
            text = text.replace(formal.lower(), informal.lower())
    return text, {f.lower() for f in facets} | {head.lower()}


def _rater_score(rng: random.Random, query_facets: set[str], head: str, product: Product, family: str) -> int:
    """One crowd rater's 1..3 grade: right family and noun, and how many named facets match."""
    title = product.title.lower()
    if product.family != family:
        base = 1.0
    else:
        named = [f for f in query_facets if f != head]
        matched = sum(f in title for f in named)
        base = 1.8 + (0.7 if head in title else 0.0) + (0.5 * matched / len(named) if named else 0.5)
        base -= 0.4 * (len(named) - matched)
    return max(1, min(3, round(base + rng.gauss(0.0, 0.45))))


def generate(seed: int = 7, per_family: int = 40, queries_per_family: int = 22) -> list[list[str]]:
    """Rows of the default judged set, in Home Depot's column order."""
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
            query, facets = _query_for(rng, target)
            if query in seen_queries:
                continue
            seen_queries.add(query)
            made += 1
            head = [f for f in facets if f in target.noun.lower()][-1]
            same = rng.sample(members, k=min(len(members), rng.randint(4, 9)))
            other_families = [f for f in by_family if f != family]
            others = [rng.choice(by_family[rng.choice(other_families)]) for _ in range(rng.randint(1, 3))]
            judged = list(dict.fromkeys([target, *same, *others]))
            rng.shuffle(judged)
            for product in judged:
                grades = [_rater_score(rng, facets, head, product, family) for _ in range(3)]
                label = round(sum(grades) / 3, 2)
                rows.append([str(row_id), str(product.uid), product.title, query, f"{label:g}"])
                row_id += 1
    return rows


def write(path: Path = DEFAULT_CATALOGUE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="latin-1", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(generate())
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CATALOGUE))
