"""Student shapes and their initialisation from a teacher."""
