"""Each method's math, free of Flower: losses, local steps, what a client shares."""
