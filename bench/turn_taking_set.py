"""The labelled sentences of ``bench/turn_taking.py``: each complete, and cut mid-phrase.

``SENTENCES`` are the ones the turn rules were tuned on; ``HELD_OUT`` were added later, cut at
other places, and are never used to tune anything: their figures are reported on their own.
"""

from __future__ import annotations

# (complete sentence, the same sentence cut mid-phrase)
SENTENCES: list[tuple[str, str]] = [
    ("I would like to book a table for four people tonight.", "I would like to book a table for"),
    ("Can you tell me about the weather in Paris?", "Can you tell me about the"),
    ("What is the capital of France?", "What is the capital of"),
    ("My phone number is five five five, one two three four.", "My phone number is five five five"),
    ("Please send the report to my manager.", "Please send the report to my"),
    ("I need to buy some milk and bread.", "I need to buy some milk and"),
    ("Could you turn off the lights in the kitchen?", "Could you turn off the lights in the"),
    ("Set an alarm for seven in the morning.", "Set an alarm for seven in the, um"),
    ("How long does it take to drive to the airport?", "How long does it take to drive to"),
    ("Remind me to call my mother tomorrow.", "Remind me to call my"),
    ("Play some relaxing music.", "Play some, uh"),
    ("What time does the pharmacy close today?", "What time does the"),
    ("I want to cancel my subscription because it is too expensive.", "I want to cancel my subscription because"),
    ("Thank you very much, goodbye.", "Thank you very much, and"),
    ("Book me a flight from London to New York.", "Book me a flight from London to"),
    ("Is it going to rain this afternoon?", "Is it going to rain this"),
    ("Add eggs, butter and flour to my shopping list.", "Add eggs, butter and"),
    ("Tell me a joke.", "Tell me a"),
    ("Where is the nearest train station?", "Where is the nearest"),
    ("I think we should leave at eight o'clock.", "I think we should leave at"),
    ("Send a message to Anna saying I will be late.", "Send a message to Anna saying"),
    ("How do I get from the hotel to the museum?", "How do I get from the hotel to the, uh"),
]
# Never tuned on: scored separately (``held_out``), so the figures are not fitted to the sentences judged.
HELD_OUT: list[tuple[str, str]] = [
    ("Turn on the radio in the living room.", "Turn on the radio in the living"),
    ("We are meeting at half past three on Thursday.", "We are meeting at half past"),
    ("Could you order two large pizzas, please?", "Could you order two large"),
    ("I lost my keys somewhere near the park yesterday.", "I lost my keys somewhere near"),
    ("Show me the photos from last summer.", "Show me the photos from last"),
    ("The package should arrive by noon.", "The package should"),
    ("Please call the dentist and move my appointment.", "Please call the dentist and move"),
    ("What is twelve times fourteen?", "What is twelve times"),
    ("I need apples, oranges, and a bag of rice.", "I need apples, oranges"),
    ("Can you read me the news headlines?", "Can you read me the news, um"),
]
HELD_OUT_ESPEAK_VOICES = ("en-gb-scotland",)
