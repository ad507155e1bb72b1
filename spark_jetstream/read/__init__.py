"""Reading a stream's messages: Direct Get reads and rows, the questions every read asks first, batch reads."""
