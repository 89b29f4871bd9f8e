"""Text banks for the synthetic generator: one topic per item community.

Immutable tuples only. Each topic's phrases recur across many items and reviews on purpose:
the semantic prototype cache needs review tokens that find near matches in other reviews.
"""

from __future__ import annotations

from typing import NamedTuple


class Topic(NamedTuple):
    category: str
    nouns: tuple[str, ...]
    adjectives: tuple[str, ...]
    features: tuple[str, ...]
    uses: tuple[str, ...]
    praise: tuple[str, ...]
    complaints: tuple[str, ...]


TOPICS: tuple[Topic, ...] = (
    Topic("Outdoor Gear",
          ("backpack", "tent", "sleeping bag", "trekking pole", "headlamp"),
          ("lightweight", "waterproof", "rugged", "compact"),
          ("reinforced seams", "a breathable mesh panel", "adjustable straps",
           "a quick-release buckle", "a weatherproof zipper", "a packable stuff sack"),
          ("weekend hikes", "long camping trips", "rainy mornings on the trail", "alpine climbs"),
          ("It kept everything dry in a heavy storm.", "It packs down smaller than I expected.",
           "The straps stay comfortable after a full day on the trail."),
          ("The zipper started to snag after a few trips.", "It is heavier than the listing says.")),
    Topic("Kitchen",
          ("chef knife", "cast iron skillet", "blender", "cutting board", "stock pot"),
          ("durable", "nonstick", "professional", "dishwasher-safe"),
          ("a full-tang stainless blade", "an even heat base", "a soft-grip handle",
           "a six-speed motor", "a juice groove around the edge", "a tempered glass lid"),
          ("weeknight dinners", "meal prep on Sundays", "baking bread", "holiday cooking"),
          ("It heats evenly and cleans up in minutes.", "The edge is still sharp after months.",
           "It feels solid and well balanced in the hand."),
          ("The handle gets hot on the stove.", "It stained after the first wash.")),
    Topic("Mystery Books",
          ("detective novel", "thriller", "crime anthology", "cozy mystery", "noir paperback"),
          ("gripping", "atmospheric", "twisty", "slow-burning"),
          ("an unreliable narrator", "a small-town setting", "a locked-room puzzle",
           "short punchy chapters", "a retired detective", "a final twist"),
          ("late-night reading", "a long flight", "a book club", "a rainy weekend"),
          ("I could not put it down until the last page.", "The twist at the end surprised me.",
           "The characters felt real and the pacing was tight."),
          ("The middle section drags a little.", "I guessed the killer halfway through.")),
    Topic("Audio",
          ("wireless earbuds", "bookshelf speaker", "noise-cancelling headphones",
           "portable speaker", "turntable"),
          ("crisp", "bass-heavy", "portable", "high-fidelity"),
          ("thirty hours of battery life", "active noise cancellation", "a USB-C charging port",
           "Bluetooth 5.3 pairing", "a built-in equalizer app", "memory foam ear cushions"),
          ("the daily commute", "working from home", "running at the gym", "movie nights"),
          ("The sound is clear with deep bass.", "Pairing with my phone took seconds.",
           "The battery easily lasts the whole week."),
          ("The connection drops now and then.", "The case feels a bit cheap.")),
    Topic("Coffee & Tea",
          ("pour-over kettle", "burr grinder", "espresso machine", "loose leaf tea sampler",
           "french press"),
          ("precise", "aromatic", "barista-grade", "single-origin"),
          ("a gooseneck spout", "forty grind settings", "a built-in thermometer",
           "a double-wall carafe", "a stainless mesh filter", "whole-bean freshness seals"),
          ("morning coffee", "slow weekend brunches", "the office break room", "afternoon tea"),
          ("My morning cup tastes like the café now.", "The grind is consistent every time.",
           "It brews a rich cup without any bitterness."),
          ("It is louder than I hoped.", "The lid does not seal tightly.")),
    Topic("Fitness",
          ("yoga mat", "adjustable dumbbell", "resistance band set", "jump rope", "foam roller"),
          ("non-slip", "heavy-duty", "space-saving", "ergonomic"),
          ("extra thick cushioning", "a quick-change weight dial", "five resistance levels",
           "a ball-bearing handle", "a textured grip surface", "a carrying strap"),
          ("home workouts", "morning stretching", "strength training", "recovery days"),
          ("It replaced half of my gym membership.", "It stays put even during hot yoga.",
           "The quality is great for the price."),
          ("It had a strong smell out of the box.", "The band snapped after two months.")),
    Topic("Gardening",
          ("pruning shears", "raised garden bed", "watering can", "seed starter kit",
           "garden hose"),
          ("sturdy", "rust-resistant", "eco-friendly", "expandable"),
          ("a bypass cutting blade", "cedar wood panels", "a long brass spout",
           "a humidity dome", "a kink-free design", "a soft-touch trigger"),
          ("spring planting", "a small balcony garden", "growing tomatoes", "trimming roses"),
          ("My seedlings sprouted within a week.", "It cuts cleanly through thick stems.",
           "It survived a whole season outside."),
          ("The assembly instructions were confusing.", "It leaked at the connector.")),
    Topic("Board Games",
          ("strategy game", "party game", "cooperative game", "card game", "puzzle box"),
          ("replayable", "family-friendly", "competitive", "beautifully illustrated"),
          ("quick setup", "sixty-minute play time", "two to six players",
           "high-quality wooden pieces", "a clear rulebook", "a solo mode"),
          ("game night with friends", "family evenings", "holiday gatherings", "two-player dates"),
          ("Everyone asked to play again right away.", "The artwork and pieces are gorgeous.",
           "It is easy to teach and hard to master."),
          ("The rules took a while to understand.", "Some cards were misprinted.")),
)

BRANDS: tuple[str, ...] = (
    "Norvik", "Altura", "Bramble", "Cobalt", "Dovetail", "Ember", "Fjord", "Granite",
    "Harbor", "Ivory", "Juniper", "Kestrel", "Lumen", "Meridian", "Nimbus", "Orchard",
)

DESCRIPTION_TEMPLATES: tuple[str, ...] = (
    "The {title} is {a_adj} {noun} designed for {use}.",
    "It comes with {feat} and {feat2}.",
    "Customers choose it for {use} because of {feat}.",
    "This {adj} {noun} pairs well with other {category} favorites.",
    "Every unit is tested for quality and backed by a two-year warranty.",
    "Thanks to {feat}, it is a reliable pick for {use}.",
    "{A_adj} design with {feat2} keeps it simple to use every day.",
)

REVIEW_OPENERS: dict[int, tuple[str, ...]] = {
    5: ("Absolutely love this {noun}.", "Five stars, this {noun} is excellent.",
        "Best {noun} I have owned."),
    4: ("Really good {noun} overall.", "Very happy with this {noun}.",
        "Solid {noun} for the money."),
    3: ("This {noun} is okay.", "Decent {noun} but not perfect.", "Mixed feelings about this {noun}."),
    2: ("Somewhat disappointed with this {noun}.", "This {noun} did not meet my expectations."),
    1: ("Do not buy this {noun}.", "Very poor {noun}, I returned it."),
}

REVIEW_BODY: tuple[str, ...] = (
    "I bought it for {use} and it works well.",
    "It has {feat}, exactly as described.",
    "I use it for {use} almost every week.",
    "Compared to my old one, {feat} is a big improvement.",
    "It arrived quickly and was well packaged.",
    "I would recommend it to anyone who needs {a_adj} {noun}.",
    "It looks even better in person than in the photos.",
)

REVIEW_CLOSERS: dict[bool, tuple[str, ...]] = {
    True: ("Would buy again.", "Highly recommended.", "Great value for the price."),
    False: ("I expected more for the price.", "I would not buy it again.",
            "Look elsewhere if you can."),
}
